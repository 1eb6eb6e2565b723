package sharedgate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/arbiter"
)

// DefaultLedgerTimeout bounds one ledger operation when LedgerOptions.Timeout
// is zero. A bucket write is a JetStream publish acknowledged by a quorum of
// the bucket's replicas, slower than a Redis script, and a ledger that does
// not answer refuses the claim; so it is given more time than Redis.
const DefaultLedgerTimeout = time.Second

// clearedPrefix starts the value a released holding leaves behind: the
// epoch it held, so that the next winner's epoch is higher even when Redis,
// which numbers epochs too, has forgotten them.
const clearedPrefix = "cleared:"

// maxProposeRounds bounds the compare-and-set retries of one Propose; each
// round is lost only to a concurrent write on the same user action, so
// running out means a storm of claims, answered as an error.
const maxProposeRounds = 4

// LedgerOptions configures the bucket of a KVLedger.
type LedgerOptions struct {
	// Bucket is the key-value bucket; empty means arbiter.DefaultLedgerBucket.
	Bucket string
	// Replicas is the bucket's replication factor: 1 on a single server, 3
	// on a cluster (a quorum must acknowledge every holding). Zero means 1.
	Replicas int
	// TTL is how long a holding is kept after its last write. Like the
	// gates', it must exceed the longest user action deadline; zero means
	// DefaultGateTTL.
	TTL time.Duration
	// Timeout bounds one operation; zero means DefaultLedgerTimeout.
	Timeout time.Duration
}

// KVLedger keeps every won claim in a JetStream key-value bucket, with
// create-if-absent and compare-and-set on the key's revision: a store that is
// consistent (a replicated bucket commits through its Raft group) and
// outlives a Redis restart. A RedisGate in fallback mode confirms each win
// there (docs/architecture.md §6). Keys are the SHA-256 of the user action,
// so no caller's key reaches the bus.
type KVLedger struct {
	kv      jetstream.KeyValue
	timeout time.Duration
}

// OpenLedger creates the bucket of cfg, or updates its settings, and returns
// the ledger on it. It fails when the server has no JetStream.
func OpenLedger(ctx context.Context, js jetstream.JetStream, cfg LedgerOptions) (*KVLedger, error) {
	if js == nil {
		return nil, errors.New("sharedgate: gate ledger: a JetStream context is required")
	}
	if cfg.Bucket == "" {
		cfg.Bucket = arbiter.DefaultLedgerBucket
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.Replicas < 1 || cfg.Replicas > 5 {
		return nil, fmt.Errorf("sharedgate: gate ledger: replicas %d not in [1, 5]", cfg.Replicas)
	}
	if cfg.TTL == 0 {
		cfg.TTL = arbiter.DefaultGateTTL
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultLedgerTimeout
	}
	if cfg.TTL < time.Second || cfg.Timeout < 0 {
		return nil, fmt.Errorf("sharedgate: gate ledger: ttl %v must be at least 1s and timeout %v not negative", cfg.TTL, cfg.Timeout)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "hedgerow winner gate: the holder of every committed user action",
		History:     1,
		TTL:         cfg.TTL,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("sharedgate: gate ledger: bucket %s: %w", cfg.Bucket, err)
	}
	return &KVLedger{kv: kv, timeout: cfg.Timeout}, nil
}

// key is the ledger key of a user action.
func (l *KVLedger) key(userAction string) string {
	sum := sha256.Sum256([]byte(userAction))
	return "ua." + hex.EncodeToString(sum[:])
}

// Propose makes want the holder of userAction unless another claim holds
// it. It returns the holder and whether it is want's group and attempt
// (a repeated proposal of the same claim wins again). A released holding
// is taken over at an epoch above the released one, so the returned holder
// may carry a higher epoch than want.
func (l *KVLedger) Propose(ctx context.Context, userAction string, want arbiter.GateValue) (arbiter.GateValue, bool, error) {
	holder, won, err := l.propose(ctx, userAction, want)
	return holder, won, withPackage(err)
}

// propose is Propose with errors that leave the package name to the caller:
// RedisGate wraps them in its own.
func (l *KVLedger) propose(ctx context.Context, userAction string, want arbiter.GateValue) (arbiter.GateValue, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	key := l.key(userAction)
	for range maxProposeRounds {
		if _, err := l.kv.Create(ctx, key, []byte(want.String())); err == nil {
			return want, true, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return arbiter.GateValue{}, false, fmt.Errorf("gate ledger: create: %w", err)
		}
		entry, err := l.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or purged since the create
		}
		if err != nil {
			return arbiter.GateValue{}, false, fmt.Errorf("gate ledger: get: %w", err)
		}
		value := string(entry.Value())
		if released, ok := clearedEpoch(value); ok {
			want.Epoch = max(want.Epoch, released+1)
			_, err := l.kv.Update(ctx, key, []byte(want.String()), entry.Revision())
			if err == nil {
				return want, true, nil
			}
			if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				continue
			}
			return arbiter.GateValue{}, false, fmt.Errorf("gate ledger: update: %w", err)
		}
		holder, err := arbiter.ParseGateValue(value)
		if err != nil {
			return arbiter.GateValue{}, false, fmt.Errorf("gate ledger: key holds a foreign value: %w", err)
		}
		return holder, holder.Group == want.Group && holder.Attempt == want.Attempt, nil
	}
	return arbiter.GateValue{}, false, fmt.Errorf("gate ledger: %d concurrent writes on one user action", maxProposeRounds)
}

// Release gives back userAction's holding if it is value, compare-and-set:
// the key keeps the released epoch. It reports whether value was held.
func (l *KVLedger) Release(ctx context.Context, userAction, value string) (bool, error) {
	released, err := l.release(ctx, userAction, value)
	return released, withPackage(err)
}

// release is Release with errors that leave the package name to the caller,
// as propose.
func (l *KVLedger) release(ctx context.Context, userAction, value string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	key := l.key(userAction)
	entry, err := l.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("gate ledger: get: %w", err)
	}
	if string(entry.Value()) != value {
		return false, nil
	}
	held, err := arbiter.ParseGateValue(value)
	if err != nil {
		return false, fmt.Errorf("gate ledger: key holds a foreign value: %w", err)
	}
	_, err = l.kv.Update(ctx, key, []byte(clearedPrefix+strconv.FormatInt(held.Epoch, 10)), entry.Revision())
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return false, nil // taken over meanwhile: no longer value's
	}
	if err != nil {
		return false, fmt.Errorf("gate ledger: update: %w", err)
	}
	return true, nil
}

// Holder returns the current holder of userAction, or ok false when none
// holds it. It exists for operators' tools and tests.
func (l *KVLedger) Holder(ctx context.Context, userAction string) (arbiter.GateValue, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	entry, err := l.kv.Get(ctx, l.key(userAction))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return arbiter.GateValue{}, false, nil
	}
	if err != nil {
		return arbiter.GateValue{}, false, fmt.Errorf("sharedgate: gate ledger: get: %w", err)
	}
	if _, ok := clearedEpoch(string(entry.Value())); ok {
		return arbiter.GateValue{}, false, nil
	}
	v, err := arbiter.ParseGateValue(string(entry.Value()))
	return v, err == nil, err
}

// clearedEpoch parses a released holding's value.
func clearedEpoch(value string) (int64, bool) {
	rest, ok := strings.CutPrefix(value, clearedPrefix)
	if !ok {
		return 0, false
	}
	epoch, err := strconv.ParseInt(rest, 10, 64)
	return epoch, err == nil
}

// withPackage starts err, an error of this package's that does not name it,
// with the package's name (docs/architecture.md §3). Errors the package
// wraps in its own are left without it, so the name is said once.
func withPackage(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("sharedgate: %w", err)
}
