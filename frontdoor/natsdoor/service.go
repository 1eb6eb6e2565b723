// Package natsdoor is hedgerow's NATS front door: the hedgerow.submit micro
// service, request-reply with streamed chunks, answering from the error
// table of package frontdoor with the statuses the HTTP door answers.
package natsdoor

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/schemas"
)

// Settings of the NATS front door.
const (
	// ServiceVersion is the micro service's version: the wire's major
	// version first.
	ServiceVersion = "1.0.0"
	// DefaultMaxInFlight bounds the requests one replica serves at once
	// when Options.MaxInFlight is zero.
	DefaultMaxInFlight = 4096
	// cancelMemory is how long a cancel that found no request is kept, in
	// case it overtook its request; cancelMemoryPerOwner bounds how many
	// one owner's are, cancelMemoryCap how many are in all (earlyCancels).
	cancelMemory         = 30 * time.Second
	cancelMemoryPerOwner = 1024
	cancelMemoryCap      = 10_000
	// maxErrorMessage bounds the message of an error answer.
	maxErrorMessage = 1024
)

// Options configure the NATS front door.
type Options struct {
	// Region is the supercluster region the door serves (config's
	// deployment.region): it registers the region's service, subject,
	// queue group and cancel subjects (schemas.RegionWire), so a region's
	// callers reach only its gateways, and a queue group with no member
	// at home never spills to another region's. Empty: today's names.
	Region string
	// DispatcherID names the runtime behind the door in the service's
	// metadata, so an operator can tell replicas apart.
	DispatcherID string
	// Keyring authenticates callers as tenants, as the HTTP door does: a
	// request carries its API key in the header Authorization as
	// "Bearer <key>" (schemas.HeaderAuthorization). A request with no key or a
	// wrong one is refused unauthenticated (401) before anything runs.
	// Nil asks for no key: NATS permissions on hedgerow.submit then decide
	// who may submit, and submissions count against Tenant.
	Keyring *frontdoor.Keyring
	// Tenant is the tenant NATS submissions count against (tenant spend
	// ceilings, idempotency keys, user action ids) when Keyring is nil;
	// empty is no tenant.
	Tenant string
	// Limiter applies each tenant's request rate and requests in flight
	// before a group runs, as the HTTP door does; nil limits nothing.
	Limiter frontdoor.TenantLimiter
	// MaxInFlight bounds the requests served at once; one more is answered
	// "unavailable" at once so its caller can retry on another replica.
	// Zero means DefaultMaxInFlight.
	MaxInFlight int
	// Replays keeps committed answers for replay, as the HTTP door's
	// (docs/architecture.md §2): a request naming the idempotency key of
	// one in flight — on this door or a replica sharing the store — joins
	// it, one of a committed one gets its messages again, one whose
	// gateway died mid-flight is taken over. Nil turns all off.
	Replays replay.Store
	// ReplayTTL is how long an answer is replayed; zero means
	// replay.DefaultTTL.
	ReplayTTL time.Duration
	// ReplayMaxBytes bounds the bytes kept of one answer; zero means
	// replay.DefaultMaxEntryBytes.
	ReplayMaxBytes int
	// ReplayLease is the lease of a request's in-flight marker, as the
	// HTTP door's (replay.Flights; markers carry DispatcherID); zero means
	// replay.DefaultLease.
	ReplayLease time.Duration
	// Elsewhere is the index of the user actions other regions committed,
	// as the HTTP door's (docs/architecture.md §14); nil in a deployment
	// of one region.
	Elsewhere replay.Elsewhere
	// ReplayMetrics count the committed answers not kept in Replays, as
	// the HTTP door's; nil counts none.
	ReplayMetrics *replay.Metrics
	// Registerer takes the door's counter of refused cancels
	// (hedgerow_nats_cancels_rejected_total); nil registers none.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Service is the hedgerow.submit front door of one Dispatcher: the NATS
// micro service schemas.SubmitServiceName, discoverable with $SRV.PING,
// $SRV.INFO and $SRV.STATS. The request, the reply framing and the way a
// caller cancels are described with schemas.SubmitSubject; the answers mean
// what the HTTP front door's do, with the stable error codes of
// schemas.ErrorCode.
type Service struct {
	d     frontdoor.Submitter
	nc    *nats.Conn
	opts  Options
	log   *slog.Logger
	svc   micro.Service
	probe *nats.Subscription
	// probePrefix is the subject under which streaming calls get a reply
	// subject of their own: the server's no-responders answer to a chunk
	// arrives there when the caller's inbox is gone.
	probePrefix string

	mu       sync.Mutex
	closed   bool
	inflight int
	nextCall uint64
	byID     map[callKey]*natsCall // calls that named a request id, by owner and id
	byProbe  map[string]*natsCall  // streaming calls, by probe token
	early    *earlyCancels         // cancels that found no call
	metrics  *cancelMetrics
	calls    sync.WaitGroup
	flights  *replay.Flights // user actions in flight, for twins to join; nil without Replays
}

// natsCall is one request being served.
type natsCall struct {
	reply  string
	key    callKey // its owner and the caller's request id; the id empty if none
	tenant string  // the caller's tenant, authenticated by its key
	// traceParent is the caller's W3C trace context header, if any.
	traceParent string
	// freeSlot releases the tenant's concurrency slot before the final
	// message goes out, so a caller that has its answer may send the next
	// request at once; serve releases it too, on every other path.
	freeSlot func()
	token    string // the probe token of a streaming call
	cancel   context.CancelCauseFunc
	// canceledByCaller says its owner cancelled it: serve then runs
	// nothing, and the caller is answered canceled.
	canceledByCaller bool
}

// Start registers the NATS front door of d on nc and returns
// once the NATS server has its subscriptions.
func Start(d frontdoor.Submitter, nc *nats.Conn, opts Options) (*Service, error) {
	if d == nil || nc == nil {
		return nil, errors.New("natsdoor: a dispatcher and a NATS connection are required")
	}
	if opts.MaxInFlight < 0 || opts.ReplayTTL < 0 || opts.ReplayMaxBytes < 0 || opts.ReplayLease < 0 {
		return nil, errors.New("natsdoor: max in flight, replay TTL and replay size must not be negative")
	}
	opts.ReplayTTL = cmp.Or(opts.ReplayTTL, replay.DefaultTTL)
	opts.ReplayMaxBytes = cmp.Or(opts.ReplayMaxBytes, replay.DefaultMaxEntryBytes)
	opts.MaxInFlight = cmp.Or(opts.MaxInFlight, DefaultMaxInFlight)
	s := &Service{
		d: d, nc: nc, opts: opts, log: opts.Logger,
		byID: map[callKey]*natsCall{}, byProbe: map[string]*natsCall{}, early: newEarlyCancels(),
	}
	var err error
	if s.metrics, err = newCancelMetrics(opts.Registerer); err != nil {
		return nil, fmt.Errorf("natsdoor: %w", err)
	}
	if opts.Replays != nil {
		if s.flights, err = replay.NewFlights(opts.Replays, replay.FlightOptions{Lease: opts.ReplayLease, Elsewhere: opts.Elsewhere, Metrics: opts.ReplayMetrics}); err != nil {
			return nil, fmt.Errorf("natsdoor: %w", err)
		}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.probePrefix = nc.NewInbox()
	if s.probe, err = nc.Subscribe(s.probePrefix+".*", s.onProbe); err != nil {
		return nil, fmt.Errorf("natsdoor: subscribe %s: %w", s.probePrefix, err)
	}
	fail := func(err error) (*Service, error) {
		if s.svc != nil {
			_ = s.svc.Stop()
		}
		_ = s.probe.Unsubscribe()
		return nil, fmt.Errorf("natsdoor: %w", err)
	}
	wire := schemas.RegionWire(opts.Region)
	s.svc, err = micro.AddService(nc, micro.Config{
		Name:        wire.SubmitServiceName(),
		Version:     ServiceVersion,
		Description: "hedgerow front door: one user action per request, hedged across equivalent routes",
		Metadata: map[string]string{
			"wire_version": strconv.Itoa(schemas.Version),
			"dispatcher":   opts.DispatcherID,
		},
	})
	if err != nil {
		return fail(fmt.Errorf("register micro service %s: %w", wire.SubmitServiceName(), err))
	}
	if err := s.svc.AddEndpoint("submit", micro.HandlerFunc(s.handleSubmit),
		micro.WithEndpointSubject(wire.SubmitSubject()),
		micro.WithEndpointQueueGroup(wire.SubmitQueueGroup()),
		micro.WithEndpointMetadata(map[string]string{
			"request":  schemas.KindSubmitRequest,
			"response": schemas.KindSubmitResponse,
			"chunk":    schemas.KindSubmitChunk,
			"framing":  "header " + schemas.HeaderStatus + ": chunk, done or error",
		})); err != nil {
		return fail(fmt.Errorf("add endpoint %s: %w", wire.SubmitSubject(), err))
	}
	// Every replica hears every cancel: only the caller's own replica runs
	// the request, and the caller cannot know which one that is. Both
	// forms, <id> and <user>.<id>, arrive here.
	if err := s.svc.AddEndpoint("cancel", micro.HandlerFunc(s.handleCancel),
		micro.WithEndpointSubject(wire.SubmitCancelPrefix()+">"),
		micro.WithEndpointQueueGroupDisabled()); err != nil {
		return fail(fmt.Errorf("add endpoint %s>: %w", wire.SubmitCancelPrefix(), err))
	}
	if err := nc.Flush(); err != nil {
		return fail(fmt.Errorf("flush subscriptions: %w", err))
	}
	return s, nil
}

// Stop stops taking requests — the micro service unregisters, so new
// requests go to other replicas, and any still delivered are answered
// "unavailable" — and waits, bounded by ctx, for the requests in flight to
// be answered. On ctx's expiry it cancels them and returns ctx's error.
func (s *Service) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	var errs []error
	if err := s.svc.Stop(); err != nil {
		errs = append(errs, fmt.Errorf("natsdoor: stop micro service: %w", err))
	}
	done := make(chan struct{})
	go func() { s.calls.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.mu.Lock()
		for _, c := range s.byID {
			if c.cancel != nil {
				c.cancel(nil)
			}
		}
		for _, c := range s.byProbe {
			c.cancel(nil)
		}
		s.mu.Unlock()
		errs = append(errs, fmt.Errorf("natsdoor: requests still in flight: %w", ctx.Err()))
	}
	if err := s.probe.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		errs = append(errs, fmt.Errorf("natsdoor: unsubscribe probe: %w", err))
	}
	return errors.Join(errs...)
}

// handleSubmit runs on the endpoint's subscription, one request at a time:
// it only admits the request and hands it to a goroutine of its own.
func (s *Service) handleSubmit(req micro.Request) {
	reply := req.Reply()
	if reply == "" {
		return // published without a reply subject: nobody to answer
	}
	id := req.Headers().Get(schemas.HeaderRequestID)
	if id != "" && !schemas.ValidSubmitRequestID(id) {
		s.fail(reply, &frontdoor.Failure{Code: string(schemas.ErrInvalidRequest),
			Message: "header " + schemas.HeaderRequestID + " must be 1 to 64 letters, digits, '_' or '-'"})
		return
	}
	// Any id is served; when neither a tenant nor a client user proves the
	// owner, only an unguessable one can be cancelled (handleCancel,
	// docs/architecture.md §8, "Cancels belong to their caller").
	user, _ := schemas.ClientInboxUser(reply)
	tenant, refusal := s.authenticate(req.Headers())
	if refusal != nil {
		s.fail(reply, refusal)
		return
	}
	call, refusal := s.admit(reply, callKey{owner{tenant, user}, id})
	if refusal != nil {
		s.fail(reply, refusal)
		return
	}
	call.tenant, call.traceParent = tenant, frontdoor.TraceParent(req.Headers().Get(frontdoor.HeaderTraceParent))
	go s.serve(call, req.Data())
}

// authenticate maps the caller's API key to its tenant when keys are
// required. The key never appears in an answer or a log.
func (s *Service) authenticate(h micro.Headers) (string, *frontdoor.Failure) {
	if s.opts.Keyring == nil {
		return s.opts.Tenant, nil
	}
	scheme, key, ok := strings.Cut(strings.TrimSpace(h.Get(schemas.HeaderAuthorization)), " ")
	if ok && strings.EqualFold(scheme, "Bearer") {
		if tenant, ok := s.opts.Keyring.Tenant(strings.TrimSpace(key)); ok {
			return tenant, nil
		}
	}
	return "", &frontdoor.Failure{Code: frontdoor.CodeInvalidAPIKey,
		Message: "A valid API key is required in the " + schemas.HeaderAuthorization + " header as 'Bearer <key>'."}
}

// admit registers a call, or says why it is refused; a request whose
// owner's cancel came first is refused canceled.
func (s *Service) admit(reply string, key callKey) (*natsCall, *frontdoor.Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, &frontdoor.Failure{Code: string(schemas.ErrUnavailable), Message: "this gateway replica is shutting down; retry"}
	case s.inflight >= s.opts.MaxInFlight:
		return nil, &frontdoor.Failure{Code: string(schemas.ErrUnavailable),
			Message: fmt.Sprintf("this gateway replica is at its limit of %d requests in flight; retry", s.opts.MaxInFlight)}
	case key.id != "" && s.byID[key] != nil:
		// Only the owner's own requests are looked at: another owner's
		// id in flight is never revealed.
		return nil, &frontdoor.Failure{Code: string(schemas.ErrInvalidRequest),
			Message: "header " + schemas.HeaderRequestID + " names another request of yours still in flight"}
	case key.id != "" && s.early.take(key, time.Now()):
		return nil, canceledFailure()
	}
	c := &natsCall{reply: reply, key: key, freeSlot: func() {}}
	if key.id != "" {
		s.byID[key] = c
	}
	s.inflight++
	s.calls.Add(1)
	return c, nil
}

// release forgets a finished call.
func (s *Service) release(c *natsCall) {
	s.mu.Lock()
	if c.key.id != "" && s.byID[c.key] == c {
		delete(s.byID, c.key)
	}
	if c.token != "" {
		delete(s.byProbe, c.token)
	}
	s.inflight--
	s.mu.Unlock()
	s.calls.Done()
}

// handleCancel cancels the request its subject names when the cancel
// proves the request's owner (docs/architecture.md §8, "Cancels belong to
// their caller"): the same tenant, the same client user, and an
// unguessable id when neither is there to prove it. One that found no
// request is remembered for a while, under its own owner, in case it
// overtook its request. A cancel gets no answer: nothing tells a sender
// whether another owner's id is in flight.
func (s *Service) handleCancel(req micro.Request) {
	user, id, err := schemas.RegionWire(s.opts.Region).ParseSubmitCancelSubject(req.Subject())
	if err != nil {
		s.metrics.reject(RejectMalformed)
		return
	}
	tenant, refusal := s.authenticate(req.Headers())
	if refusal != nil {
		s.metrics.reject(RejectUnauthenticated)
		return
	}
	if s.opts.Keyring == nil && user == "" && !schemas.UnguessableSubmitRequestID(id) {
		s.metrics.reject(RejectGuessableID)
		return
	}
	key := callKey{owner{tenant, user}, id}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.byID[key]; c != nil {
		c.canceledByCaller = true // admitted, not yet running: serve looks here
		if c.cancel != nil {
			c.cancel(errCanceledByCaller)
		}
		return
	}
	if !s.early.remember(key, time.Now()) {
		s.metrics.reject(RejectMemoryFull)
	}
}

// onProbe cancels a streaming call whose caller's inbox has no subscriber:
// the NATS server's no-responders status came back for one of its chunks.
func (s *Service) onProbe(m *nats.Msg) {
	if len(m.Data) != 0 || m.Header.Get("Status") != "503" {
		return
	}
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	s.mu.Lock()
	c := s.byProbe[token]
	s.mu.Unlock()
	if c != nil {
		c.cancel(nil)
	}
}

// serve runs one request to its answer.
func (s *Service) serve(c *natsCall, data []byte) {
	defer s.release(c)
	sub, serr := s.submission(data, c.tenant)
	if serr != nil {
		s.fail(c.reply, serr)
		return
	}
	sub.TraceParent = c.traceParent
	release, serr := frontdoor.AdmitTenant(context.Background(), s.opts.Limiter, sub.Tenant)
	if serr != nil {
		s.fail(c.reply, serr)
		return
	}
	c.freeSlot = release
	defer release() // on every path: answer, failure, caller gone, panic (a second call frees nothing)
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	var sink *natsSink
	s.mu.Lock()
	c.cancel = cancel
	if c.canceledByCaller {
		// Cancelled between its admission and now: run no group at all.
		s.mu.Unlock()
		release()
		s.fail(c.reply, canceledFailure())
		return
	}
	if sub.Request.Stream {
		s.nextCall++
		c.token = strconv.FormatUint(s.nextCall, 36)
		s.byProbe[c.token] = c
		sink = &natsSink{nc: s.nc, subject: c.reply, probe: s.probePrefix + "." + c.token}
	}
	s.mu.Unlock()
	if s.opts.Replays != nil && sub.IdempotencyKey != "" {
		s.serveIdempotent(ctx, c, sub, sink) // replay.go
		return
	}
	s.run(ctx, c, sub, sink)
}

// run submits one request and sends its answer or its failure; it
// returns the answer's message, nil when none was sent.
func (s *Service) run(ctx context.Context, c *natsCall, sub dispatcher.Submission, sink *natsSink) []byte {
	var ds dispatcher.Sink
	if sink != nil {
		ds = sink
	}
	resp, err := s.d.Submit(ctx, sub, ds)
	if err != nil {
		if ctx.Err() != nil {
			s.endCanceled(ctx, c)
			return nil
		}
		if f := s.failureFor(err); f != nil {
			c.freeSlot()
			s.fail(c.reply, f)
		}
		return nil
	}
	c.freeSlot()
	return s.answer(c.reply, submitResponse(resp))
}

// endCanceled answers a request whose context ended: canceled when its
// owner cancelled it; nothing when its caller went away (nobody is left to
// tell) or the door stopped.
func (s *Service) endCanceled(ctx context.Context, c *natsCall) {
	if errors.Is(context.Cause(ctx), errCanceledByCaller) {
		c.freeSlot()
		s.fail(c.reply, canceledFailure())
	}
}

// submission reads and checks a request: its version, its schema, then the
// Submission it asks for.
func (s *Service) submission(data []byte, tenant string) (dispatcher.Submission, *frontdoor.Failure) {
	var req schemas.SubmitRequest
	if err := schemas.Decode(data, &req); err != nil {
		return dispatcher.Submission{}, &frontdoor.Failure{Code: string(schemas.ErrInvalidRequest), Message: "the request is not a version-1 submit request: " + err.Error()}
	}
	if err := schemas.Validate(schemas.KindSubmitRequest, data); err != nil {
		return dispatcher.Submission{}, &frontdoor.Failure{Code: string(schemas.ErrInvalidRequest), Message: "the request does not match the submit_request schema: " + err.Error()}
	}
	// What the HTTP door refuses before a group runs, this door refuses too.
	if req.OperationClass != "" && !s.d.HasOperation(req.OperationClass) {
		return dispatcher.Submission{}, &frontdoor.Failure{Code: string(schemas.ErrInvalidRequest), Param: "operation_class",
			Message: "operation_class names no configured operation class."}
	}
	if req.Request.Embedding != nil {
		// A submit response carries no vectors: the HTTP door serves
		// embeddings (POST /v1/embeddings).
		return dispatcher.Submission{}, &frontdoor.Failure{Code: string(schemas.ErrInvalidRequest), Param: "embedding",
			Message: "embeddings are served by the HTTP door only (POST /v1/embeddings)."}
	}
	if limit := s.d.MaxTokens(req.ModelClass); req.Request.MaxTokens > limit && limit > 0 {
		return dispatcher.Submission{}, frontdoor.MaxTokensOver("max_tokens", limit)
	}
	if len(req.Request.ResponseFormat) > 0 {
		if err := s.d.CheckResponseFormat(context.Background(), tenant, req.ModelClass, req.Request.ResponseFormat); err != nil {
			return dispatcher.Submission{}, frontdoor.FailureFor(err)
		}
	}
	return dispatcher.Submission{
		Operation: req.OperationClass, Pool: req.ModelClass, Tenant: tenant,
		IdempotencyKey: req.IdempotencyKey, Request: req.Request,
		Deadline:        frontdoor.CallerDeadline(req.DeadlineMs),
		AwaitTotalUsage: true, // total_usage is every attempt's
	}, nil
}

// failureFor maps an error of Submit to its answer; nil means the caller
// is gone and nothing is to be sent.
func (s *Service) failureFor(err error) *frontdoor.Failure {
	f := frontdoor.FailureFor(err)
	if f != nil && f.Code == frontdoor.CodeInternal {
		s.log.Warn("nats submit failed", "err", err)
	}
	return f
}

// submitResponse is the wire form of a committed answer. The submission
// awaited the group's end, so TotalUsage is every attempt's, the losers'
// included (estimated for a cancelled attempt that reported none).
func submitResponse(r *dispatcher.Response) schemas.SubmitResponse {
	out := schemas.SubmitResponse{
		UserActionID: r.UserActionID, GroupID: r.GroupID,
		Content: r.Content, FinishReason: r.FinishReason,
		Usage: r.Usage, TotalUsage: r.TotalUsage,
		Attempts: r.Attempts, Hedged: r.Hedged, WinnerAttempt: r.Winner, WinnerRoute: r.WinnerRoute,
	}
	if len(r.ToolCalls) > 0 && json.Valid(r.ToolCalls) {
		out.ToolCalls = r.ToolCalls
	}
	if gv, err := arbiter.ParseGateValue(r.Gate); err == nil {
		out.Gate = &schemas.GateValue{GroupID: gv.Group, Attempt: gv.Attempt, Epoch: gv.Epoch}
	}
	return out
}

// answer sends the final message of a success and returns it; nil when it
// could not be sent.
func (s *Service) answer(reply string, resp schemas.SubmitResponse) []byte {
	data, err := json.Marshal(resp)
	if err != nil {
		s.log.Warn("nats submit answer not encoded", "err", err)
		s.fail(reply, &frontdoor.Failure{Code: frontdoor.CodeInternal, Message: "The answer could not be encoded.", Group: resp.GroupID})
		return nil
	}
	msg := &nats.Msg{Subject: reply, Header: nats.Header{schemas.HeaderStatus: {schemas.StatusDone}}, Data: data}
	if err := s.nc.PublishMsg(msg); err != nil {
		s.log.Debug("nats submit answer not sent", "err", err)
		return nil
	}
	return data
}

// fail sends the final message of a failure: the micro error headers, the
// stable code, and the SubmitError as the body.
func (s *Service) fail(reply string, f *frontdoor.Failure) {
	se := schemas.SubmitError{Code: f.WireCode(), Message: headerSafe(f.Message)}
	if f.Holder != "" {
		if gv, err := arbiter.ParseGateValue(f.Holder); err == nil {
			se.Winner = &schemas.GateValue{GroupID: gv.Group, Attempt: gv.Attempt, Epoch: gv.Epoch}
		}
	}
	data, err := json.Marshal(se)
	if err != nil {
		data = nil
	}
	h := nats.Header{}
	h.Set(micro.ErrorCodeHeader, strconv.Itoa(f.Status(frontdoor.NATS)))
	h.Set(micro.ErrorHeader, se.Message)
	h.Set(schemas.HeaderStatus, schemas.StatusError)
	h.Set(schemas.HeaderErrorCode, string(se.Code))
	h.Set(schemas.HeaderShouldRetry, strconv.FormatBool(f.ShouldRetry()))
	if v := f.RetryAfterHeader(); v != "" {
		h.Set(schemas.HeaderRetryAfter, v)
	}
	if f.Region != "" {
		h.Set(schemas.HeaderRegion, f.Region)
	}
	if f.Group != "" {
		h.Set(schemas.HeaderGroup, f.Group)
	}
	if err := s.nc.PublishMsg(&nats.Msg{Subject: reply, Header: h, Data: data}); err != nil {
		s.log.Debug("nats submit error not sent", "err", err)
	}
}

// headerSafe makes a message fit one header line of bounded length.
func headerSafe(msg string) string {
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > maxErrorMessage {
		msg = msg[:maxErrorMessage-3] + "..."
	}
	return msg
}

// natsSink publishes a committed stream to the caller's reply subject.
// Each chunk has the call's probe subject as its reply, so a caller whose
// inbox is gone is noticed (see onProbe).
type natsSink struct {
	nc      *nats.Conn
	subject string
	probe   string
	seq     int64
	// chunks records the chunks sent, for replay; nil records none.
	chunks *frames
}

// Delta sends one chunk; an error means the connection is gone, which
// cancels the group.
func (k *natsSink) Delta(d dispatcher.Delta) error {
	tools := json.RawMessage(nil)
	if len(d.ToolCalls) > 0 && json.Valid(d.ToolCalls) {
		tools = d.ToolCalls
	}
	if d.Content == "" && tools == nil {
		return nil
	}
	k.seq++
	data, err := json.Marshal(schemas.SubmitChunk{Seq: k.seq, Delta: d.Content, ToolCalls: tools})
	if err != nil {
		return fmt.Errorf("encode chunk: %w", err)
	}
	msg := &nats.Msg{Subject: k.subject, Reply: k.probe, Header: nats.Header{schemas.HeaderStatus: {schemas.StatusChunk}}, Data: data}
	if err := k.nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("publish chunk: %w", err)
	}
	k.chunks.add(data)
	return nil
}
