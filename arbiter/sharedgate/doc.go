// Package sharedgate is the winner gate that the replicas of one deployment
// share (docs/architecture.md §6): RedisGate, which confirms each win of its
// arbiter.LocalGate with one Lua script on Redis, and KVLedger, the JetStream
// key-value bucket that confirms every win — and decides alone while Redis
// cannot answer — in fallback mode. It holds the gate's go-redis and
// JetStream dependencies, so that the arbiter package, and the simulator
// that links it, link neither.
package sharedgate
