// Package moe owns expert routing: routers (softmax / sigmoid top-k,
// group-limited, score-bias correction, top-k-then-softmax), routing tables
// (expert → ranks, with replicas), dispatch/combine plans, the CPU reference
// expert computation and expert parallelism over a transport.
package moe
