// Package natslease is the lease.Authority of a deployment: the tables of
// the global ceilings in a JetStream key-value bucket, which every region
// reads and writes with compare-and-set on the key's revision. The regions
// are NATS clusters joined as a supercluster by gateway links, and the
// bucket lives in one of them (Options.Placement).
//
// Keys: a ceiling key ("tenant:acme:rate") is stored under its unpadded
// URL-safe base64, since KV keys forbid ':' and most of what a tenant may
// be named.
package natslease
