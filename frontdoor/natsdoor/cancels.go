package natsdoor

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/schemas"
)

// Cancels belong to their caller (docs/architecture.md §8, "Cancels belong
// to their caller"): a request is named by its owner and its id, so a
// cancel names it only when it proves the owner the request proved.

// owner is who sent a request, as far as the gateway can tell: the tenant
// its key authenticated (Options.Tenant without a keyring) and the client
// user whose inbox its reply subject is under (empty for none).
type owner struct {
	tenant string
	user   string
}

// callKey names a request: ids are scoped per owner, so another owner's
// request of the same id neither collides nor is found.
type callKey struct {
	owner
	id string
}

// Reasons a cancel is refused, the label of hedgerow_nats_cancels_rejected_total.
const (
	// RejectMalformed: the subject is no cancel subject
	// (schemas.ParseSubmitCancelSubject).
	RejectMalformed = "malformed"
	// RejectUnauthenticated: tenants are configured and the cancel carries
	// none of their keys.
	RejectUnauthenticated = "unauthenticated"
	// RejectGuessableID: neither a tenant nor a client user proves the
	// owner, and the id is too short to be its only proof
	// (schemas.UnguessableSubmitRequestID).
	RejectGuessableID = "guessable_id"
	// RejectMemoryFull: the cancel found no request and the memory of
	// early cancels had no room for it.
	RejectMemoryFull = "memory_full"
)

// errCanceledByCaller is the cause of a request's context when its owner
// cancelled it: it alone earns the caller a final canceled answer.
var errCanceledByCaller = errors.New("natsdoor: cancelled by its caller")

// canceledFailure is the final answer to a request its caller cancelled.
func canceledFailure() *frontdoor.Failure {
	return &frontdoor.Failure{Code: string(schemas.ErrCanceled), Message: "The request was cancelled by its caller."}
}

// earlyCancels remembers, for cancelMemory, the cancels that found no
// request, in case they overtook it. Each owner keeps at most
// cancelMemoryPerOwner (an owner's flood evicts its own oldest, never
// another's), and all together at most cancelMemoryCap (past it a new one
// is refused).
type earlyCancels struct {
	byOwner map[owner]map[string]time.Time
	total   int
}

func newEarlyCancels() *earlyCancels {
	return &earlyCancels{byOwner: map[owner]map[string]time.Time{}}
}

// remember keeps the cancel of k; false when there is no room for it.
func (e *earlyCancels) remember(k callKey, now time.Time) bool {
	ids := e.byOwner[k.owner]
	if _, ok := ids[k.id]; ok {
		ids[k.id] = now
		return true
	}
	if len(ids) >= cancelMemoryPerOwner {
		e.expire(k.owner, ids, now)
	}
	if len(ids) >= cancelMemoryPerOwner {
		e.forget(k.owner, ids, oldest(ids))
	}
	if e.total >= cancelMemoryCap {
		for o, ids := range e.byOwner {
			e.expire(o, ids, now)
		}
	}
	if e.total >= cancelMemoryCap {
		return false
	}
	ids = e.byOwner[k.owner] // forgetting an owner's last cancel forgot its map
	if ids == nil {
		ids = map[string]time.Time{}
		e.byOwner[k.owner] = ids
	}
	ids[k.id] = now
	e.total++
	return true
}

// take forgets the cancel of k and reports whether one was remembered,
// not yet expired.
func (e *earlyCancels) take(k callKey, now time.Time) bool {
	ids := e.byOwner[k.owner]
	at, ok := ids[k.id]
	if !ok {
		return false
	}
	e.forget(k.owner, ids, k.id)
	return now.Sub(at) <= cancelMemory
}

// expire forgets o's cancels older than cancelMemory.
func (e *earlyCancels) expire(o owner, ids map[string]time.Time, now time.Time) {
	for id, at := range ids {
		if now.Sub(at) > cancelMemory {
			e.forget(o, ids, id)
		}
	}
}

func (e *earlyCancels) forget(o owner, ids map[string]time.Time, id string) {
	delete(ids, id)
	e.total--
	if len(ids) == 0 {
		delete(e.byOwner, o)
	}
}

// oldest is the id of the earliest cancel of ids, which is not empty.
func oldest(ids map[string]time.Time) string {
	var id string
	var first time.Time
	for k, at := range ids {
		if id == "" || at.Before(first) {
			id, first = k, at
		}
	}
	return id
}

// cancelMetrics count the refused cancels by reason; never by id, user or
// tenant.
type cancelMetrics struct {
	rejected *prometheus.CounterVec
}

func newCancelMetrics(reg prometheus.Registerer) (*cancelMetrics, error) {
	m := &cancelMetrics{rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hedgerow_nats_cancels_rejected_total",
		Help: "Cancels on hedgerow.submit.cancel.> the NATS door refused, by reason: malformed, unauthenticated, guessable_id, memory_full.",
	}, []string{"reason"})}
	for _, r := range []string{RejectMalformed, RejectUnauthenticated, RejectGuessableID, RejectMemoryFull} {
		m.rejected.WithLabelValues(r)
	}
	if reg != nil {
		if err := reg.Register(m.rejected); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *cancelMetrics) reject(reason string) { m.rejected.WithLabelValues(reason).Inc() }
