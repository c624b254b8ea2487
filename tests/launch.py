"""What the multi-process tests give torchrun: two processes on this machine, meeting at a port the system
chooses (--standalone: one picked here beforehand could be taken by something else before torchrun binds it),
on the loopback address (--standalone would otherwise give the workers this machine's host name, which a
container without DNS may not resolve)."""

TWO_LOCAL_PROCESSES = ["--nproc_per_node", "2", "--standalone", "--local-addr", "127.0.0.1"]
