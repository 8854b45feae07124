//! Batched packet I/O on a host interface: AF_PACKET sockets with mmap rings, joined in a
//! fanout group whose classic BPF program steers each svnic frame to the worker serving its
//! destination endpoint.
