package natslease

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/budgets/lease"
)

// DefaultBucket is the key-value bucket of the tables when Options.Bucket
// is empty.
const DefaultBucket = "hedgerow_leases"

// Options configures the bucket of an Authority. Every region must name the
// same bucket; the first to start creates it with its Placement and
// Replicas, the others bind to it as it is.
type Options struct {
	// Bucket is the key-value bucket; empty means DefaultBucket.
	Bucket string
	// Placement is the NATS cluster (the region) whose servers hold the
	// bucket; empty lets JetStream choose, usually the creator's cluster.
	// The region that holds it keeps renewing when it is cut off from the
	// others; they do not (see the package doc).
	Placement string
	// Replicas is the bucket's replication factor within its cluster: 1 on
	// a single server, 3 on a cluster of three. Zero means 1.
	Replicas int
}

// Authority keeps the leases' tables in a JetStream key-value bucket:
// a table's revision is its key's revision, and writes are compare-and-set
// on it, which the bucket's stream leader (or Raft group) serializes.
type Authority struct {
	kv jetstream.KeyValue
}

// Authority is a lease.Authority.
var _ lease.Authority = (*Authority)(nil)

// New binds to the bucket of o, creating it when it does not exist. Binding
// needs only the bucket's own servers, so a region restarted while the
// JetStream meta leader is unreachable still binds; creating needs the meta
// leader. An existing bucket is left as it is: changing its placement or
// replicas is an operator's edit of its stream, not a region's start.
func New(ctx context.Context, js jetstream.JetStream, o Options) (*Authority, error) {
	if js == nil {
		return nil, errors.New("natslease: a JetStream context is required")
	}
	if o.Bucket == "" {
		o.Bucket = DefaultBucket
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.Replicas < 1 || o.Replicas > 5 {
		return nil, fmt.Errorf("natslease: bucket %s: replicas %d not in [1, 5]", o.Bucket, o.Replicas)
	}
	kv, err := js.KeyValue(ctx, o.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		cfg := jetstream.KeyValueConfig{
			Bucket:      o.Bucket,
			Description: "hedgerow regional leases: the table of each global ceiling",
			// One revision per key: a table is read and written whole,
			// and an older one is never wanted back.
			History:  1,
			Storage:  jetstream.FileStorage,
			Replicas: o.Replicas,
		}
		if o.Placement != "" {
			cfg.Placement = &jetstream.Placement{Cluster: o.Placement}
		}
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, o.Bucket) // another region created it first
		}
	}
	if err != nil {
		return nil, fmt.Errorf("natslease: bucket %s: %w", o.Bucket, err)
	}
	return &Authority{kv: kv}, nil
}

// Get implements lease.Authority: the table under key and its revision, or
// a zero table and revision 0 when the bucket has none (or it was deleted).
func (a *Authority) Get(ctx context.Context, key string) (lease.Table, uint64, error) {
	k, err := kvKey(key)
	if err != nil {
		return lease.Table{}, 0, err
	}
	e, err := a.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return lease.Table{}, 0, nil
	}
	if err != nil {
		return lease.Table{}, 0, fmt.Errorf("natslease: get %q: %w", key, err)
	}
	var t lease.Table
	if err := json.Unmarshal(e.Value(), &t); err != nil {
		return lease.Table{}, 0, fmt.Errorf("natslease: get %q: revision %d is not a table: %w", key, e.Revision(), err)
	}
	return t, e.Revision(), nil
}

// Put implements lease.Authority: it writes t under key if the key's
// revision is still rev (0: if it has no table) and returns the new
// revision, or lease.ErrConflict when another write came first.
func (a *Authority) Put(ctx context.Context, key string, t lease.Table, rev uint64) (uint64, error) {
	k, err := kvKey(key)
	if err != nil {
		return 0, err
	}
	data, err := json.Marshal(t)
	if err != nil {
		return 0, fmt.Errorf("natslease: put %q: %w", key, err)
	}
	var next uint64
	if rev == 0 {
		next, err = a.kv.Create(ctx, k, data)
	} else {
		next, err = a.kv.Update(ctx, k, data, rev)
	}
	switch {
	case err == nil:
		return next, nil
	// Create answers ErrKeyExists; Update, ErrKeyRevisionMismatch, also
	// for a key with no table at all (the stream's "wrong last sequence"
	// either way, whatever the bucket's replicas).
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return 0, fmt.Errorf("natslease: put %q at revision %d: %w", key, rev, lease.ErrConflict)
	}
	return 0, fmt.Errorf("natslease: put %q at revision %d: %w", key, rev, err)
}

// kvKey is the bucket's key of ceiling key: its unpadded URL-safe base64.
// Ceiling keys hold ':' and whatever a tenant is named, and a KV key allows
// only letters, digits and "-/_=.", with '.' separating subject tokens; the
// encoding is one-to-one, so no two ceilings share a key, and its alphabet
// has no '.', so each is one token. The empty key, which no ceiling has, is
// refused.
func kvKey(key string) (string, error) {
	if key == "" {
		return "", fmt.Errorf("natslease: %w: empty ceiling key", lease.ErrInvalid)
	}
	return base64.RawURLEncoding.EncodeToString([]byte(key)), nil
}
