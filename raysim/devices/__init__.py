"""Clients as devices: speed, bandwidth and availability from traces (issue 60). numpy only."""
