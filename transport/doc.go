// Package transport moves tensors between ranks. Backends: in-process
// (emulated ranks on one machine) today; CUDA IPC, the RDMA proxy and NCCL
// plug in behind the same interface.
package transport
