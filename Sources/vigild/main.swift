print("vigild: skeleton")
