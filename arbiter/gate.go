package arbiter

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Gate elects the single winner of a user action (docs/architecture.md §6). The first
// claim wins; later claims from other groups of the same user action lose
// and learn the holder. LocalGate is authoritative within one dispatcher;
// a Redis gate extends the same interface across replicas.
type Gate interface {
	// Claim tries to make (group, attempt) the winner of userAction.
	// Claiming again with the same group and attempt is idempotent: it
	// returns the same won claim without a new epoch.
	Claim(ctx context.Context, userAction, group string, attempt int) (Claim, error)
	// Clear releases a won claim that did not commit, by compare-and-delete:
	// only the claim's own holding is removed, never another group's. It
	// returns ErrNotHolder when the claim does not hold the gate.
	Clear(ctx context.Context, c Claim) error
}

// Claim is the outcome of Gate.Claim.
type Claim struct {
	// UserAction, Group and Attempt repeat what was claimed, so a Claim is
	// all Clear needs.
	UserAction string
	Group      string
	Attempt    int
	// Won reports that this claim holds the gate.
	Won bool
	// Epoch is the user action's election count: the won claim's epoch, or
	// the current holder's when lost. Each won claim increments it.
	Epoch int64
	// Value is this claim's gate value (group/attempt/epoch) when Won, empty
	// otherwise. It travels with the result so that effect executors can
	// check they act on the committed winner.
	Value string
	// Holder is the gate value of whoever holds the gate — Value itself when
	// Won — so a losing group can name the winner (already_committed).
	Holder string
}

// GateValue is the parsed form of a gate value: which group and attempt won
// a user action, at which epoch.
type GateValue struct {
	Group   string
	Attempt int
	Epoch   int64
}

// String renders the gate value as "group/attempt/epoch".
func (v GateValue) String() string {
	return v.Group + "/" + strconv.Itoa(v.Attempt) + "/" + strconv.FormatInt(v.Epoch, 10)
}

// ParseGateValue parses "group/attempt/epoch". The two numbers are taken
// from the right, so a group id may itself contain slashes.
func ParseGateValue(s string) (GateValue, error) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return GateValue{}, fmt.Errorf("arbiter: gate value %q: want group/attempt/epoch", s)
	}
	epoch, err := strconv.ParseInt(s[i+1:], 10, 64)
	if err != nil || epoch < 1 {
		return GateValue{}, fmt.Errorf("arbiter: gate value %q: epoch must be a positive integer", s)
	}
	rest := s[:i]
	j := strings.LastIndexByte(rest, '/')
	if j <= 0 {
		return GateValue{}, fmt.Errorf("arbiter: gate value %q: want group/attempt/epoch", s)
	}
	attempt, err := strconv.Atoi(rest[j+1:])
	if err != nil || attempt < 0 {
		return GateValue{}, fmt.Errorf("arbiter: gate value %q: attempt must be a non-negative integer", s)
	}
	return GateValue{Group: rest[:j], Attempt: attempt, Epoch: epoch}, nil
}

// DefaultGateTTL is how long a LocalGate remembers a user action after its
// last won claim when LocalGateOptions.TTL is zero. It must outlast any user
// action's deadline, so that a late claim still finds the winner.
const DefaultGateTTL = 10 * time.Minute

// DefaultLedgerBucket names the JetStream key-value bucket of the shared
// gate's ledger (arbiter/sharedgate) when its configuration names none. It
// is here, not beside the ledger, so that what only needs the name — the
// NATS permissions, the cluster's tooling — links no JetStream client.
const DefaultLedgerBucket = "hedgerow_gate"

// LocalGateOptions configures a LocalGate.
type LocalGateOptions struct {
	// TTL is how long a user action is remembered after its last won claim;
	// zero means DefaultGateTTL. Once it lapses the entry — holder and epoch
	// — is forgotten, so it must exceed the longest user action deadline.
	TTL time.Duration
	// Now is the clock; nil means time.Now. Tests inject a fake clock.
	Now func() time.Time
}

// LocalGate is the in-process gate: a compare-and-swap per user action
// under one mutex. It is authoritative for the groups this dispatcher owns.
// Claims never block on anything but the mutex, so the context is unused.
type LocalGate struct {
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	actions map[string]*gateEntry
	// expiry queues user actions in the order their entries expire. The TTL
	// is constant, so appending on every win keeps it sorted (up to clock
	// steps backwards, which only delay eviction); sweeping its head evicts
	// expired entries in amortised O(1) per claim.
	expiry []expiryItem
	head   int
}

type gateEntry struct {
	held    bool
	holder  GateValue
	epoch   int64
	expires time.Time
}

type expiryItem struct {
	userAction string
	expires    time.Time
}

var _ Gate = (*LocalGate)(nil)

// NewLocalGate returns an empty in-process gate.
func NewLocalGate(cfg LocalGateOptions) (*LocalGate, error) {
	if cfg.TTL < 0 {
		return nil, fmt.Errorf("arbiter: local gate: ttl %v must not be negative", cfg.TTL)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultGateTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &LocalGate{ttl: cfg.TTL, now: cfg.Now, actions: make(map[string]*gateEntry)}, nil
}

// Claim implements Gate.
func (g *LocalGate) Claim(_ context.Context, userAction, group string, attempt int) (Claim, error) {
	if userAction == "" || group == "" || attempt < 0 {
		return Claim{}, fmt.Errorf("%w: user action %q, group %q, attempt %d", ErrInvalidClaim, userAction, group, attempt)
	}
	c := Claim{UserAction: userAction, Group: group, Attempt: attempt}
	now := g.now()

	g.mu.Lock()
	defer g.mu.Unlock()
	g.sweep(now)

	e := g.actions[userAction]
	if e != nil && !e.expires.After(now) {
		delete(g.actions, userAction) // expired but not yet swept
		e = nil
	}
	if e == nil {
		e = &gateEntry{}
		g.actions[userAction] = e
	}
	if e.held {
		c.Epoch = e.epoch
		c.Holder = e.holder.String()
		if e.holder.Group == group && e.holder.Attempt == attempt {
			c.Won = true
			c.Value = c.Holder
		}
		return c, nil
	}

	e.epoch++
	e.held = true
	e.holder = GateValue{Group: group, Attempt: attempt, Epoch: e.epoch}
	e.expires = now.Add(g.ttl)
	g.expiry = append(g.expiry, expiryItem{userAction: userAction, expires: e.expires})

	c.Won = true
	c.Epoch = e.epoch
	c.Value = e.holder.String()
	c.Holder = c.Value
	return c, nil
}

// Clear implements Gate. The user action's epoch survives the clear, so the
// next winner's gate value differs from the cleared one.
func (g *LocalGate) Clear(_ context.Context, c Claim) error {
	if c.UserAction == "" {
		return fmt.Errorf("%w: clear without a user action", ErrInvalidClaim)
	}
	if !c.Won || c.Value == "" {
		return fmt.Errorf("%w: clear %s", ErrNotHolder, c.UserAction)
	}
	now := g.now()

	g.mu.Lock()
	defer g.mu.Unlock()
	g.sweep(now)

	e := g.actions[c.UserAction]
	if e == nil || !e.held || !e.expires.After(now) || e.holder.String() != c.Value {
		return fmt.Errorf("%w: clear %s", ErrNotHolder, c.UserAction)
	}
	e.held = false
	e.holder = GateValue{}
	return nil
}

// Len reports how many user actions the gate remembers, including expired
// ones not yet evicted. It exists for metrics and tests.
func (g *LocalGate) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.actions)
}

// Adopt records the decision of a gate shared across replicas
// (arbiter/sharedgate's RedisGate, which consults this gate first) on a
// claim that won this gate with localValue. A shared win replaces the local
// value with the shared one (same group and attempt, the shared epoch), so
// later local claims lose at once to the holder the shared gate names and a
// Clear with the shared value finds it. A shared loss releases the local
// entry: the holder is another replica's group, for which this gate is not
// authoritative, so later claims ask the shared gate again instead of
// losing to a holder that replica may clear. An entry meanwhile held by
// another value is left alone. The local epoch follows the shared one, so a
// local loser reports the holder's epoch.
func (g *LocalGate) Adopt(userAction, localValue string, holder GateValue, won bool) {
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sweep(now)
	e := g.actions[userAction]
	if e == nil || !e.expires.After(now) {
		if !won {
			return
		}
		e = &gateEntry{}
		g.actions[userAction] = e
	}
	if e.held && e.holder.String() != localValue {
		return
	}
	e.epoch = holder.Epoch
	if !won {
		e.held, e.holder = false, GateValue{}
		return
	}
	e.held, e.holder = true, holder
	e.expires = now.Add(g.ttl)
	g.expiry = append(g.expiry, expiryItem{userAction: userAction, expires: e.expires})
}

// sweep evicts entries whose TTL has lapsed. An entry re-won since its queue
// item was appended carries a later expiry and is kept. g.mu must be held.
func (g *LocalGate) sweep(now time.Time) {
	for g.head < len(g.expiry) && !g.expiry[g.head].expires.After(now) {
		it := g.expiry[g.head]
		g.expiry[g.head] = expiryItem{}
		g.head++
		if e := g.actions[it.userAction]; e != nil && !e.expires.After(now) {
			delete(g.actions, it.userAction)
		}
	}
	// Reclaim the consumed prefix once it dominates, so the queue's backing
	// array stays proportional to the live entries.
	if g.head > 64 && g.head*2 >= len(g.expiry) {
		g.expiry = append(g.expiry[:0], g.expiry[g.head:]...)
		g.head = 0
	}
}
