"""The names of FedOT's side channels (sync centring, FedOT spec §3.3)."""

#: downlink: the server's head mean v̄, and the personal-step scale (1/n, literal_alg1)
VBAR, PERSONAL_SCALE = "fedot/vbar", "fedot/personal_scale"
#: uplink: Δṽ_i, the round's change of the client's head
DUAL_DELTA = "fedot/dual_delta"
