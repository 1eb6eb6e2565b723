package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/hedgerow/hedgerow/schemas"
)

// ServiceVersion is the version of the micro service a worker registers
// (schemas.WorkerServiceName): the wire's major version as semver.
const ServiceVersion = "1.0.0"

// Errors of the package, which callers may branch on with errors.Is.
var (
	// ErrInvalidOptions is matched by every error New returns for a bad Options.
	ErrInvalidOptions = errors.New("worker: invalid options")

	// Errors of the Worker's lifecycle.
	ErrStarted    = errors.New("worker: already started")
	ErrNotStarted = errors.New("worker: not started")

	// Errors of StartWorkers; each is wrapped with the route it concerns.

	// ErrProviderNotSupported: the route's provider has no adapter yet.
	ErrProviderNotSupported = errors.New("worker: provider not supported yet")
	// ErrMissingAPIKey: the environment variable a route names for its
	// provider key is unset or empty.
	ErrMissingAPIKey = errors.New("worker: provider API key not set")
	// ErrUnknownRoute: a route asked for is not in the configuration.
	ErrUnknownRoute = errors.New("worker: unknown route")

	// Causes of an attempt's context ending, which decide the status it
	// reports. Their texts travel to the dispatcher as the attempt result's
	// error_message, a wire field, so they keep them, without the
	// package's prefix.
	errCancelled = errors.New("cancelled by the dispatcher")
	errDeadline  = errors.New("attempt deadline reached")
	errShutdown  = errors.New("worker shutting down")
	errReplyLost = errors.New("reply inbox unreachable")
)

type lifecycle int

const (
	created lifecycle = iota
	started
	stopping
	stopped
)

// Worker runs the attempts of one route. It holds no state about an attempt
// beyond the attempt's own lifetime, except a briefly remembered early
// Cancel (PendingCancelTTL). Create it with New, then Start and Stop it once.
type Worker struct {
	cfg     Options
	log     *slog.Logger
	metrics *Metrics

	mu          sync.Mutex
	state       lifecycle
	running     map[attemptKey]*attemptRun
	pending     *pendingCancels
	idle        chan struct{} // closed when stopping and nothing runs
	attemptSub  *nats.Subscription
	attemptDone <-chan nats.SubStatus
	controlSub  *nats.Subscription
	controlDone <-chan nats.SubStatus
	svc         micro.Service
	runs        sync.WaitGroup // one per attempt goroutine
	leases      *leaseKeeper   // nil without Options.Leases

	controlInbox string

	// testHookDrained, when set, is called once Stop has closed the attempt
	// subscription: no attempt is taken after it.
	testHookDrained func()
}

// New validates cfg and returns a worker that is not yet subscribed.
func New(cfg Options) (*Worker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.Metrics.createLabelSets(cfg.Route)
	return &Worker{
		cfg:     cfg,
		log:     cfg.Logger.With("route", cfg.Route, "worker_id", cfg.WorkerID),
		metrics: cfg.Metrics,
		running: make(map[attemptKey]*attemptRun),
		pending: newPendingCancels(),
		leases:  newLeaseKeeper(cfg, cfg.Logger.With("route", cfg.Route, "worker_id", cfg.WorkerID, "component", "leases")),
	}, nil
}

// ID returns the worker's id, as Accept and records name it.
func (w *Worker) ID() string { return w.cfg.WorkerID }

// ControlInbox returns the subject the worker takes Cancels on; empty until
// Start.
func (w *Worker) ControlInbox() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.controlInbox
}

// Start subscribes to the control inbox, then to the route's attempts, and
// registers the micro service, in that order, so that every Accept names an
// inbox that is already listened on.
func (w *Worker) Start() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state != created {
		return ErrStarted
	}
	nc := w.cfg.Conn
	inbox := nc.NewInbox()
	csub, err := nc.Subscribe(inbox, w.handleControl)
	if err != nil {
		return fmt.Errorf("worker: %s: subscribe control inbox: %w", w.cfg.WorkerID, err)
	}
	wire := schemas.RegionWire(w.cfg.Region)
	asub, err := nc.QueueSubscribe(wire.AttemptSubject(w.cfg.Route), wire.WorkerQueueGroup(w.cfg.Route), w.handleAttempt)
	if err != nil {
		_ = csub.Unsubscribe()
		return fmt.Errorf("worker: %s: subscribe %s: %w", w.cfg.WorkerID, wire.AttemptSubject(w.cfg.Route), err)
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        wire.WorkerServiceName(),
		Version:     ServiceVersion,
		Description: "hedgerow attempt worker",
		Metadata: map[string]string{
			"route":        w.cfg.Route,
			"worker_id":    w.cfg.WorkerID,
			"region":       w.cfg.Region,
			"subject":      wire.AttemptSubject(w.cfg.Route),
			"queue_group":  wire.WorkerQueueGroup(w.cfg.Route),
			"max_inflight": strconv.Itoa(w.cfg.MaxInflight),
			"wire_version": strconv.Itoa(schemas.Version),
		},
	})
	if err != nil {
		_ = asub.Unsubscribe()
		_ = csub.Unsubscribe()
		return fmt.Errorf("worker: %s: register micro service %s: %w", w.cfg.WorkerID, wire.WorkerServiceName(), err)
	}
	// Return only once the server has the subscriptions: an attempt sent
	// after Start reaches this worker, and a readiness ping is answered.
	if err := nc.Flush(); err != nil {
		_ = svc.Stop()
		_ = asub.Unsubscribe()
		_ = csub.Unsubscribe()
		return fmt.Errorf("worker: %s: flush subscriptions: %w", w.cfg.WorkerID, err)
	}
	// Ask for the closed status before anything can close them.
	w.attemptDone = asub.StatusChanged(nats.SubscriptionClosed)
	w.controlDone = csub.StatusChanged(nats.SubscriptionClosed)
	w.controlSub, w.attemptSub, w.svc, w.controlInbox = csub, asub, svc, inbox
	w.state = started
	w.leases.start()
	w.metrics.setInflight(w.cfg.Route, 0)
	w.metrics.setMaxInflight(w.cfg.Route, w.cfg.MaxInflight)
	w.log.Info("worker started", "subject", wire.AttemptSubject(w.cfg.Route), "max_inflight", w.cfg.MaxInflight)
	return nil
}

// Stop is the worker's SIGTERM: it stops taking attempts at once (the
// attempt subscription is drained, and attempts still queued in the client
// are answered Busy so the dispatcher offers them to another worker), stops the
// micro service so readiness fails, lets in-flight attempts finish within
// DrainGrace, then cancels the rest, which report status canceled with
// scope transient. Cancels are honoured until the last attempt ends. When
// Stop returns nil no goroutine of the worker is left; ctx bounds the whole
// wait, and on its expiry Stop cancels what runs and returns ctx's error.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	if w.state != started {
		st := w.state
		w.mu.Unlock()
		if st == created {
			return ErrNotStarted
		}
		return nil
	}
	w.state = stopping
	w.idle = make(chan struct{})
	if len(w.running) == 0 {
		close(w.idle)
	}
	w.mu.Unlock()

	// The service first, so that readiness fails no later than the last
	// attempt is taken; its unsubscriptions reach the server before the
	// drain's flush does.
	var errs []error
	if err := w.svc.Stop(); err != nil {
		errs = append(errs, fmt.Errorf("worker: stop micro service: %w", err))
	}
	if err := w.attemptSub.Drain(); err != nil {
		// A closed connection closed the subscription too, silently.
		errs = append(errs, fmt.Errorf("worker: drain attempt subscription: %w", err))
	} else if err := waitClosed(ctx, w.attemptDone); err != nil {
		w.cancelAll(errShutdown)
		return errors.Join(append(errs, fmt.Errorf("worker: wait for attempt subscription to drain: %w", err), w.stopLeases(ctx))...)
	}
	// A drained subscription closes only after its last callback returned:
	// every attempt delivered to this worker has been answered.
	if w.testHookDrained != nil {
		w.testHookDrained()
	}

	grace := time.NewTimer(w.cfg.DrainGrace)
	select {
	case <-w.idle:
	case <-grace.C:
		w.log.Warn("drain grace over, cancelling attempts", "grace", w.cfg.DrainGrace)
	case <-ctx.Done():
	}
	grace.Stop()
	w.cancelAll(errShutdown)

	done := make(chan struct{})
	go func() {
		w.runs.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return errors.Join(append(errs, fmt.Errorf("worker: wait for cancelled attempts: %w", ctx.Err()), w.stopLeases(ctx))...)
	}
	// Every attempt has ended: give their leases back.
	if err := w.stopLeases(ctx); err != nil {
		errs = append(errs, err)
	}

	if err := w.controlSub.Drain(); err != nil {
		errs = append(errs, fmt.Errorf("worker: drain control subscription: %w", err))
	} else if err := waitClosed(ctx, w.controlDone); err != nil {
		errs = append(errs, fmt.Errorf("worker: wait for control subscription to drain: %w", err))
	}
	if err := flush(ctx, w.cfg.Conn); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		errs = append(errs, fmt.Errorf("worker: flush results: %w", err))
	}
	if c, ok := w.cfg.Upstream.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	w.mu.Lock()
	w.state = stopped
	w.mu.Unlock()
	w.log.Info("worker stopped")
	return errors.Join(errs...)
}

// stopLeases stops the lease keeper, which releases the leases it holds;
// an error means ctx ended before it had stopped.
func (w *Worker) stopLeases(ctx context.Context) error {
	if err := w.leases.close(ctx); err != nil {
		return fmt.Errorf("worker: stop route leases: %w", err)
	}
	return nil
}

// flush waits for the server to have everything published so far, within
// ctx's deadline or else the client's default flush timeout.
func flush(ctx context.Context, nc *nats.Conn) error {
	if _, ok := ctx.Deadline(); ok {
		return nc.FlushWithContext(ctx)
	}
	return nc.Flush()
}

// waitClosed waits for a subscription's closed status, or ctx.
func waitClosed(ctx context.Context, closed <-chan nats.SubStatus) error {
	select {
	case <-closed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *Worker) cancelAll(cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.running {
		r.cancel(cause)
	}
}

// handleAttempt answers one attempt message. It runs on the attempt
// subscription's goroutine, one message at a time, and returns at once:
// the attempt itself runs on a goroutine of its own.
func (w *Worker) handleAttempt(msg *nats.Msg) {
	received := w.cfg.Now()

	att, err := schemas.DecodeAttempt(msg.Data)
	if err != nil {
		reason := DropMalformed
		if errors.Is(err, schemas.ErrUnsupportedVersion) {
			reason = DropVersion
		}
		w.metrics.drop(w.cfg.Route, reason)
		w.log.Warn("attempt dropped", "reason", reason, "error", err)
		return
	}
	// A commit point is required (attempt.schema.json): without one the
	// attempt's record would carry commit_point "", which no reader takes.
	if att.GroupID == "" || att.Attempt < 1 || att.ReplyInbox == "" || att.CommitPoint == (schemas.CommitPoint{}) {
		w.metrics.drop(w.cfg.Route, DropMalformed)
		w.log.Warn("attempt dropped", "reason", DropMalformed, "group_id", att.GroupID, "attempt", att.Attempt)
		return
	}
	key := attemptKey{att.GroupID, att.Attempt}

	w.mu.Lock()
	if _, dup := w.running[key]; dup {
		w.mu.Unlock()
		w.metrics.drop(w.cfg.Route, DropDuplicate)
		w.log.Warn("attempt dropped", "reason", DropDuplicate, "group_id", att.GroupID, "attempt", att.Attempt)
		return
	}
	if w.state != started || len(w.running) >= w.cfg.MaxInflight {
		w.mu.Unlock()
		w.publishReply(att.ReplyInbox, schemas.Busy{GroupID: att.GroupID, Attempt: att.Attempt, WorkerID: w.cfg.WorkerID, Secret: att.Secret})
		w.metrics.answered(w.cfg.Route, schemas.StatusBusy)
		return
	}
	early, cancelled := w.pending.take(key, att.Secret, received)
	r := newAttemptRun(w, att, received)
	w.running[key] = r
	w.metrics.setInflight(w.cfg.Route, len(w.running))
	if cancelled {
		r.cancelAt, r.cancelReason = early.at, early.reason
		r.cancel(errCancelled)
	}
	w.runs.Add(1)
	w.mu.Unlock()
	w.leases.begin(key) // before the run starts, so its end comes after

	if err := w.publishReply(att.ReplyInbox, schemas.Accept{
		GroupID: att.GroupID, Attempt: att.Attempt, WorkerID: w.cfg.WorkerID, ControlInbox: w.controlInbox,
		Secret: att.Secret,
	}); err != nil {
		r.cancel(errReplyLost)
	}
	// Published after the Accept, so every later message follows it.
	go r.run()
}

// handleControl applies a Cancel from the control inbox: only one that
// carries the attempt's secret, which only the dispatcher that sent the
// attempt (and whoever could read it) knows (docs/architecture.md §8).
// Anyone may publish on the control inbox, whose name every Accept
// carries.
func (w *Worker) handleControl(msg *nats.Msg) {
	now := w.cfg.Now()
	var c schemas.Cancel
	if err := schemas.Decode(msg.Data, &c); err != nil {
		w.metrics.rejectCancel(w.cfg.Route, RejectMalformed)
		w.log.Warn("control message dropped", "reason", RejectMalformed, "error", err)
		return
	}
	key := attemptKey{c.GroupID, c.Attempt}
	w.mu.Lock()
	defer w.mu.Unlock()
	r, ok := w.running[key]
	if !ok {
		// Kept by its secret: a forged cancel that comes first neither
		// stands for the real one nor cancels the attempt when it comes.
		w.pending.add(key, c.Secret, c.Reason, now)
		return
	}
	if !schemas.SameSecret(r.att.Secret, c.Secret) {
		w.metrics.rejectCancel(w.cfg.Route, RejectSecret)
		w.log.Warn("cancel rejected", "reason", RejectSecret, "group_id", c.GroupID, "attempt", c.Attempt)
		return
	}
	if r.cancelAt.IsZero() {
		r.cancelAt, r.cancelReason = now, c.Reason
		r.cancel(errCancelled)
	}
}

// finish removes an ended attempt and returns what cancel it had received.
func (w *Worker) finish(r *attemptRun) (cancelAt time.Time, reason schemas.CancelReason) {
	w.leases.end(r.key)
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.running, r.key)
	w.metrics.setInflight(w.cfg.Route, len(w.running))
	if w.state == stopping && len(w.running) == 0 {
		select {
		case <-w.idle:
		default:
			close(w.idle)
		}
	}
	return r.cancelAt, r.cancelReason
}

// publishReply publishes one message on an attempt's reply inbox.
func (w *Worker) publishReply(inbox string, m json.Marshaler) error {
	data, err := m.MarshalJSON()
	if err == nil {
		err = w.cfg.Conn.Publish(inbox, data)
	}
	if err != nil {
		w.log.Warn("reply not published", "error", err)
		return fmt.Errorf("worker: publish reply: %w", err)
	}
	return nil
}
