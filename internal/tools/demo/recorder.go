package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/schemas"
)

// recorder is the independent subscriber of the attempt and group records:
// its own NATS connection, counting what the records say, so double commits
// are judged by the published record rather than by the code that prevents
// them.
type recorder struct {
	nc   *nats.Conn
	subs []*nats.Subscription

	mu       sync.Mutex
	groups   map[string][]schemas.GroupRecord   // by user action id
	attempts map[string][]schemas.AttemptRecord // by hedge group id
	nGroups  int
	nAttempt int
	bad      int           // records that did not decode
	changed  chan struct{} // a group record arrived (capacity 1)
}

// startRecorder connects to url and subscribes to both record subjects,
// returning once the server has registered the subscriptions.
// It connects as the observer user (seed: its nkey seed file), which may
// read the records and nothing else.
func startRecorder(url, seed string) (*recorder, error) {
	auth, err := nats.NkeyOptionFromSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("recorder: %w", err)
	}
	nc, err := nats.Connect(url, nats.Name("hedgerow-demo-recorder"), auth)
	if err != nil {
		return nil, fmt.Errorf("recorder: connect to %s: %w", url, err)
	}
	r := &recorder{
		nc: nc, groups: map[string][]schemas.GroupRecord{}, attempts: map[string][]schemas.AttemptRecord{},
		changed: make(chan struct{}, 1),
	}
	for subject, handler := range map[string]nats.MsgHandler{
		schemas.GroupRecordSubject:   r.onGroup,
		schemas.AttemptRecordSubject: r.onAttempt,
	} {
		sub, err := nc.Subscribe(subject, handler)
		if err != nil {
			nc.Close()
			return nil, fmt.Errorf("recorder: subscribe %s: %w", subject, err)
		}
		// Records must never be dropped as a slow consumer's.
		if err := sub.SetPendingLimits(-1, -1); err != nil {
			nc.Close()
			return nil, fmt.Errorf("recorder: %w", err)
		}
		r.subs = append(r.subs, sub)
	}
	if err := nc.Flush(); err != nil {
		nc.Close()
		return nil, fmt.Errorf("recorder: flush subscriptions: %w", err)
	}
	return r, nil
}

func (r *recorder) onGroup(m *nats.Msg) {
	var g schemas.GroupRecord
	err := json.Unmarshal(m.Data, &g)
	r.mu.Lock()
	if err != nil {
		r.bad++
	} else {
		r.groups[g.UserActionID] = append(r.groups[g.UserActionID], g)
		r.nGroups++
	}
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

func (r *recorder) onAttempt(m *nats.Msg) {
	var a schemas.AttemptRecord
	err := json.Unmarshal(m.Data, &a)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.bad++
		return
	}
	r.attempts[a.HedgeGroupID] = append(r.attempts[a.HedgeGroupID], a)
	r.nAttempt++
}

// waitGroups waits until every user action in uas has a group record, for
// at most timeout; it returns how many are still missing.
func (r *recorder) waitGroups(ctx context.Context, uas []string, timeout time.Duration) (int, error) {
	limit := time.NewTimer(timeout)
	defer limit.Stop()
	for {
		missing := r.missing(uas)
		if missing == 0 {
			return 0, nil
		}
		select {
		case <-r.changed:
		case <-limit.C:
			return missing, nil
		case <-ctx.Done():
			return missing, ctx.Err()
		}
	}
}

func (r *recorder) missing(uas []string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, ua := range uas {
		if len(r.groups[ua]) == 0 {
			n++
		}
	}
	return n
}

// group returns the first group record of a user action and how many of
// its group records say committed.
func (r *recorder) group(ua string) (first *schemas.GroupRecord, committed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	gs := r.groups[ua]
	if len(gs) == 0 {
		return nil, 0
	}
	g := gs[0]
	return &g, count(gs, isCommitted)
}

// doubleCommits counts, over every record seen, the user actions with more
// than one committed group record and the groups with more than one attempt
// record saying winner, continuations aside (isWinner).
func (r *recorder) doubleCommits() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, gs := range r.groups {
		if count(gs, isCommitted) > 1 {
			n++
		}
	}
	for _, as := range r.attempts {
		if count(as, isWinner) > 1 {
			n++
		}
	}
	return n
}

func isCommitted(g schemas.GroupRecord) bool { return g.Outcome == schemas.GroupCommitted }

// isWinner reports whether an attempt record says the attempt won its
// group's commit. A continuation (docs/architecture.md §6, "Rescue")
// carries on the stream a winner committed and broke, and is recorded
// winner too; it extends that commit, never a second one of its group.
func isWinner(a schemas.AttemptRecord) bool {
	return a.Outcome == schemas.OutcomeWinner && a.Role != schemas.RoleContinuation
}

// count returns how many elements of xs is holds for.
func count[T any](xs []T, is func(T) bool) int {
	n := 0
	for _, x := range xs {
		if is(x) {
			n++
		}
	}
	return n
}

// counts reports how many group and attempt records arrived, and how many
// did not decode.
func (r *recorder) counts() (groups, attempts, bad int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.nGroups, r.nAttempt, r.bad
}

// close ends the subscriptions and closes the connection.
func (r *recorder) close() {
	for _, s := range r.subs {
		_ = s.Unsubscribe()
	}
	r.nc.Close()
}
