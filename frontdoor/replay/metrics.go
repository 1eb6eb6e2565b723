package replay

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a committed answer was not kept for replay, the label values of
// hedgerow_replay_answers_not_kept_total (docs/architecture.md §9).
const (
	// NotKeptTooLarge: over max_entry_bytes (the door's recorder or the
	// store); its tombstone is kept instead.
	NotKeptTooLarge = "too_large"
	// NotKeptStoreFull: keeping it would pass the store's max_total_bytes
	// (ErrStoreFull); its tombstone is kept instead when that still fits.
	NotKeptStoreFull = "store_full"
	// NotKeptStoreFailed: the store failed for the whole of the door's
	// bound; nothing is kept.
	NotKeptStoreFailed = "store_failed"
	// NotKeptEvicted: a Memory store dropped a live answer, the oldest, to
	// make room for a new one.
	NotKeptEvicted = "evicted"
)

// notKeptReasons are every reason, each series created at zero.
var notKeptReasons = []string{NotKeptTooLarge, NotKeptStoreFull, NotKeptStoreFailed, NotKeptEvicted}

// Metrics count the committed answers a gateway delivered but did not
// keep for replay, by reason: a retry of one is refused answer_not_kept
// (its tombstone) or meets the winner gate. One per gateway, shared by its
// store and both doors' Flights, so it outlives a reload's generations.
// A nil *Metrics counts nothing.
type Metrics struct {
	notKept *prometheus.CounterVec
}

// NewMetrics registers the counter with reg (nil: registered nowhere).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{notKept: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "hedgerow_replay_answers_not_kept_total",
		Help: "Committed answers delivered but not kept for replay, by reason: too_large (its tombstone kept), store_full (max_total_bytes reached; its tombstone kept if it fit), store_failed, evicted (a memory store's oldest, for room).",
	}, []string{"reason"})}
	for _, r := range notKeptReasons {
		m.notKept.WithLabelValues(r)
	}
	if reg != nil {
		if err := reg.Register(m.notKept); err != nil {
			return nil, fmt.Errorf("replay: register the metrics: %w", err)
		}
	}
	return m, nil
}

// NotKept counts one answer not kept for reason.
func (m *Metrics) NotKept(reason string) {
	if m != nil {
		m.notKept.WithLabelValues(reason).Inc()
	}
}
