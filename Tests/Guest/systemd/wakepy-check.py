"""wakepy (a library Vigil did not write) keeps the system awake, as a
lingering user would, through the user's own vigild on their session bus.
Prints 'lease held through vigild' when vigild shows the lease wakepy took."""
import json
import subprocess

from wakepy import keep

with keep.running() as mode:
    print("wakepy active:", mode.active, "method:", mode.active_method)
    leases = json.loads(subprocess.run(["vigilctl", "leases", "--json"], capture_output=True, text=True, check=True).stdout)
    print("vigild's leases:", json.dumps(leases))
    if mode.active and leases:
        print("lease held through vigild")
after = json.loads(subprocess.run(["vigilctl", "leases", "--json"], capture_output=True, text=True, check=True).stdout)
print("after wakepy's mode ended:", json.dumps(after))
