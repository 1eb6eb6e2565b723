package config

import "fmt"

// Role is the part a hedgerow process plays; it decides which secrets and
// settings the process needs. (It is not schemas.Role, the role of an attempt.)
type Role string

// Process roles.
const (
	// RoleServe runs gateway and workers in one process with an embedded NATS
	// server.
	RoleServe Role = "serve"
	// RoleGateway runs dispatchers and front doors against external NATS.
	RoleGateway Role = "gateway"
	// RoleWorker runs workers that call providers, against external NATS.
	RoleWorker Role = "worker"
)

// ParseRole parses a role name.
func ParseRole(s string) (Role, error) {
	switch r := Role(s); r {
	case RoleServe, RoleGateway, RoleWorker:
		return r, nil
	}
	return "", fmt.Errorf("role %q: want serve, gateway or worker", s)
}

// CallsProviders reports whether the role runs workers, which hold the
// routes' provider keys.
func (r Role) CallsProviders() bool { return r == RoleServe || r == RoleWorker }

// HashesUserActions reports whether the role turns Idempotency-Keys into
// user action ids, which replicas sharing a Redis must do with one key
// (redis.hash_key_env); workers never do.
func (r Role) HashesUserActions() bool { return r == RoleServe || r == RoleGateway }

// AuthenticatesCallers reports whether the role runs the front doors, which
// let callers in by the tenants' API key hashes.
func (r Role) AuthenticatesCallers() bool { return r == RoleServe || r == RoleGateway }

// NeedsExternalNATS reports whether the role connects to a NATS cluster
// rather than embedding a server.
func (r Role) NeedsExternalNATS() bool { return r == RoleGateway || r == RoleWorker }
