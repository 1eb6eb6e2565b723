package worker

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/schemas"
)

// Reasons an attempt message is dropped without an answer, the "reason"
// label of hedgerow_worker_dropped_total.
const (
	DropVersion   = "version"   // a major version this worker does not speak
	DropMalformed = "malformed" // not an attempt, or no group, number or reply inbox
	DropDuplicate = "duplicate" // the same group and attempt is already running here
)

// Reasons a Cancel is rejected, the "reason" label of
// hedgerow_worker_cancels_rejected_total.
const (
	RejectMalformed = "malformed" // not a cancel of this wire version
	RejectSecret    = "secret"    // the attempt runs here, and the cancel does not carry its secret
)

// Metrics are the worker's Prometheus collectors (docs/architecture.md §9). One Metrics is
// shared by every worker of a process, so that several routes can run in one
// process against one registry; the route is a label.
type Metrics struct {
	attempts      *prometheus.CounterVec
	inflight      *prometheus.GaugeVec
	maxInflight   *prometheus.GaugeVec
	dropped       *prometheus.CounterVec
	cancellations *prometheus.CounterVec
	cancelLatency prometheus.Histogram
	leaseErrors   *prometheus.CounterVec
	rejected      *prometheus.CounterVec
}

// NewMetrics returns unregistered collectors; register them with Register
// or Collectors.
func NewMetrics() *Metrics {
	return &Metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgerow_worker_attempts_total",
			Help: "Attempts a worker answered, by route and status class (busy: refused at the in-flight limit or while stopping).",
		}, []string{"route", "status"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hedgerow_worker_inflight",
			Help: "Attempts a worker is running.",
		}, []string{"route"}),
		maxInflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hedgerow_worker_max_inflight",
			Help: "Attempts a worker runs at most at once (its route's max_inflight): hedgerow_worker_inflight over it is the worker's busy ratio.",
		}, []string{"route"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgerow_worker_dropped_total",
			Help: "Attempt messages a worker dropped without an answer: version, malformed or duplicate.",
		}, []string{"route", "reason"}),
		cancellations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgerow_worker_cancellations_total",
			Help: "Cancels a worker received for attempts it took, by whether the attempt stopped on it (true) or completed anyway (false).",
		}, []string{"observed"}),
		cancelLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hedgerow_cancel_latency_seconds",
			Help:    "Time from a worker receiving a cancel to its upstream call returning.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 20), // 50 µs … ~26 s: a cancel on one machine takes well under a millisecond
		}),
		leaseErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgerow_worker_lease_errors_total",
			Help: "Route in-flight lease calls to the shared store that failed, by operation (acquire, renew, release); the attempts went on, and an unrenewed lease expires on its own.",
		}, []string{"route", "op"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hedgerow_worker_cancels_rejected_total",
			Help: "Cancels a worker did not obey, by reason: malformed, or secret (it does not carry the running attempt's secret: not from the dispatcher that sent the attempt).",
		}, []string{"route", "reason"}),
	}
}

// Collectors returns the collectors, for callers that register them
// themselves.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.attempts, m.inflight, m.maxInflight, m.dropped, m.cancellations, m.cancelLatency, m.leaseErrors, m.rejected}
}

// Register registers every collector with reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	var errs []error
	for _, c := range m.Collectors() {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("worker: register metrics: %w", err)
	}
	return nil
}

func (m *Metrics) answered(route string, status schemas.StatusClass) {
	m.attempts.WithLabelValues(route, string(status)).Inc()
}

func (m *Metrics) drop(route, reason string) {
	m.dropped.WithLabelValues(route, reason).Inc()
}

func (m *Metrics) rejectCancel(route, reason string) {
	m.rejected.WithLabelValues(route, reason).Inc()
}

// createLabelSets creates, at zero, the series of route whose labels are
// known before its first attempt, so a dashboard or an alert finds each from
// the start (docs/architecture.md §9): an absent series reads as "no data",
// which an alert cannot tell from a healthy zero.
func (m *Metrics) createLabelSets(route string) {
	m.inflight.WithLabelValues(route)
	for _, op := range []string{LeaseAcquire, LeaseRenew, LeaseRelease} {
		m.leaseErrors.WithLabelValues(route, op)
	}
	for _, observed := range []bool{false, true} {
		m.cancellations.WithLabelValues(strconv.FormatBool(observed))
	}
}

func (m *Metrics) setMaxInflight(route string, n int) {
	m.maxInflight.WithLabelValues(route).Set(float64(n))
}

func (m *Metrics) setInflight(route string, n int) {
	m.inflight.WithLabelValues(route).Set(float64(n))
}

func (m *Metrics) leaseFailed(route, op string) {
	m.leaseErrors.WithLabelValues(route, op).Inc()
}

// cancelled counts a cancel the worker received for an attempt it took;
// latency is negative when the upstream call had already returned.
func (m *Metrics) cancelled(observed bool, latency time.Duration) {
	m.cancellations.WithLabelValues(strconv.FormatBool(observed)).Inc()
	if latency >= 0 {
		m.cancelLatency.Observe(latency.Seconds())
	}
}
