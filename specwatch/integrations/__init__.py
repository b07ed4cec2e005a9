"""Code that runs inside other programs (gateways) and reads the daemon over HTTP only; never imported by it."""
