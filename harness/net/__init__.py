"""The run's network: hosts as network namespaces and their faults, the resolver view, nftables
in JSON, a host as a whole machine, the network safety rule, TCP sockets from /proc, what a
torch store holds."""
