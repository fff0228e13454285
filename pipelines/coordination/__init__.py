"""How processes and hosts agree: leases with fencing epochs, where leases are stored, whether a holder is alive,
fenced Delta commits, and the crash campaign's named kill points."""
