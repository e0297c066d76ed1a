// Package transport moves tensors between ranks. Backends: in-process
// (NewLocalWorld: emulated ranks on one machine) and gRPC between processes
// (JoinGRPC: ranks bootstrapped through a coordinator, payloads over TCP);
// CUDA IPC, the RDMA proxy and NCCL plug in behind the same interface.
package transport
