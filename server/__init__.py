"""The proxy server: one session per client process, backends behind one interface."""
