print("vigilctl: skeleton")
