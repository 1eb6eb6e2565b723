package dispatcher

import (
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

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/schemas"
)

// Settings of the NATS front door.
const (
	// NATSServiceVersion is the micro service's version: the wire's major
	// version first.
	NATSServiceVersion = "1.0.0"
	// NATSQueueGroup is the queue group of the submit endpoint: each request
	// goes to one gateway replica.
	NATSQueueGroup = "hedgerow-gateway"
	// DefaultNATSMaxInFlight bounds the requests one replica serves at once
	// when NATSServiceOptions.MaxInFlight is zero.
	DefaultNATSMaxInFlight = 4096
	// cancelMemory is how long a cancel that found no request is kept, in
	// case it overtook its request; cancelMemoryCap bounds how many are.
	cancelMemory    = 30 * time.Second
	cancelMemoryCap = 10_000
	// maxNATSErrorMessage bounds the message of an error answer.
	maxNATSErrorMessage = 1024
	// maxNATSDeadline bounds a caller's deadline_ms so it cannot overflow;
	// the dispatcher never lengthens the policy's deadline anyway.
	maxNATSDeadline = 24 * time.Hour
)

// NATSServiceOptions configure the NATS front door.
type NATSServiceOptions struct {
	// Tenant is the tenant NATS submissions count against (tenant spend
	// ceilings, user action ids). NATS permissions on hedgerow.submit decide
	// who may submit at all; empty is no tenant.
	Tenant string
	// MaxInFlight bounds the requests served at once; one more is answered
	// "unavailable" at once so its caller can retry on another replica.
	// Zero means DefaultNATSMaxInFlight.
	MaxInFlight int
	Logger      *slog.Logger
}

// NATSService is the hedgerow.submit front door of one Dispatcher: the NATS
// micro service schemas.SubmitServiceName, discoverable with $SRV.PING,
// $SRV.INFO and $SRV.STATS. The request, the reply framing and the way a
// caller cancels are described with schemas.SubmitSubject; the answers mean
// what the HTTP front door's do, with the stable error codes of
// schemas.ErrorCode.
type NATSService struct {
	d     *Dispatcher
	nc    *nats.Conn
	opts  NATSServiceOptions
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
	byID     map[string]*natsCall // calls that named a request id
	byProbe  map[string]*natsCall // streaming calls, by probe token
	canceled map[string]time.Time // cancels that found no call, by request id
	calls    sync.WaitGroup
}

// natsCall is one request being served.
type natsCall struct {
	reply  string
	id     string // the caller's request id; empty if none
	token  string // the probe token of a streaming call
	cancel context.CancelFunc
}

// StartNATSService registers the NATS front door of d on nc and returns
// once the NATS server has its subscriptions.
func StartNATSService(d *Dispatcher, nc *nats.Conn, opts NATSServiceOptions) (*NATSService, error) {
	if d == nil || nc == nil {
		return nil, errors.New("nats front door: a dispatcher and a NATS connection are required")
	}
	if opts.MaxInFlight < 0 {
		return nil, fmt.Errorf("nats front door: max in flight %d is negative", opts.MaxInFlight)
	}
	if opts.MaxInFlight == 0 {
		opts.MaxInFlight = DefaultNATSMaxInFlight
	}
	s := &NATSService{
		d: d, nc: nc, opts: opts, log: opts.Logger,
		byID: map[string]*natsCall{}, byProbe: map[string]*natsCall{}, canceled: map[string]time.Time{},
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.probePrefix = nc.NewInbox()
	var err error
	if s.probe, err = nc.Subscribe(s.probePrefix+".*", s.onProbe); err != nil {
		return nil, fmt.Errorf("nats front door: subscribe %s: %w", s.probePrefix, err)
	}
	fail := func(err error) (*NATSService, error) {
		if s.svc != nil {
			_ = s.svc.Stop()
		}
		_ = s.probe.Unsubscribe()
		return nil, fmt.Errorf("nats front door: %w", err)
	}
	s.svc, err = micro.AddService(nc, micro.Config{
		Name:        schemas.SubmitServiceName,
		Version:     NATSServiceVersion,
		Description: "hedgerow front door: one user action per request, hedged across equivalent routes",
		Metadata: map[string]string{
			"wire_version": strconv.Itoa(schemas.Version),
			"dispatcher":   d.id,
		},
	})
	if err != nil {
		return fail(fmt.Errorf("register micro service %s: %w", schemas.SubmitServiceName, err))
	}
	if err := s.svc.AddEndpoint("submit", micro.HandlerFunc(s.handleSubmit),
		micro.WithEndpointSubject(schemas.SubmitSubject),
		micro.WithEndpointQueueGroup(NATSQueueGroup),
		micro.WithEndpointMetadata(map[string]string{
			"request":  schemas.KindSubmitRequest,
			"response": schemas.KindSubmitResponse,
			"chunk":    schemas.KindSubmitChunk,
			"framing":  "header " + schemas.HeaderStatus + ": chunk, done or error",
		})); err != nil {
		return fail(fmt.Errorf("add endpoint %s: %w", schemas.SubmitSubject, err))
	}
	// Every replica hears every cancel: only the caller's own replica runs
	// the request, and the caller cannot know which one that is.
	if err := s.svc.AddEndpoint("cancel", micro.HandlerFunc(s.handleCancel),
		micro.WithEndpointSubject(schemas.SubmitCancelPrefix+"*"),
		micro.WithEndpointQueueGroupDisabled()); err != nil {
		return fail(fmt.Errorf("add endpoint %s*: %w", schemas.SubmitCancelPrefix, err))
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
func (s *NATSService) Stop(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	var errs []error
	if err := s.svc.Stop(); err != nil {
		errs = append(errs, fmt.Errorf("nats front door: stop micro service: %w", err))
	}
	done := make(chan struct{})
	go func() { s.calls.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.mu.Lock()
		for _, c := range s.byID {
			if c.cancel != nil {
				c.cancel()
			}
		}
		for _, c := range s.byProbe {
			c.cancel()
		}
		s.mu.Unlock()
		errs = append(errs, fmt.Errorf("nats front door: requests still in flight: %w", ctx.Err()))
	}
	if err := s.probe.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		errs = append(errs, fmt.Errorf("nats front door: unsubscribe probe: %w", err))
	}
	return errors.Join(errs...)
}

// handleSubmit runs on the endpoint's subscription, one request at a time:
// it only admits the request and hands it to a goroutine of its own.
func (s *NATSService) handleSubmit(req micro.Request) {
	reply := req.Reply()
	if reply == "" {
		return // published without a reply subject: nobody to answer
	}
	id := req.Headers().Get(schemas.HeaderRequestID)
	if id != "" && !schemas.ValidSubmitRequestID(id) {
		s.fail(reply, &schemas.SubmitError{Code: schemas.ErrInvalidRequest,
			Message: "header " + schemas.HeaderRequestID + " must be 1 to 64 letters, digits, '_' or '-'"}, "")
		return
	}
	call, refusal := s.admit(reply, id)
	if refusal != nil {
		s.fail(reply, refusal, "")
		return
	}
	if call == nil {
		return // cancelled before it arrived: the caller is gone
	}
	go s.serve(call, req.Data())
}

// admit registers a call, or says why it is refused. A nil call with no
// refusal is a request whose cancel came first.
func (s *NATSService) admit(reply, id string) (*natsCall, *schemas.SubmitError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, &schemas.SubmitError{Code: schemas.ErrUnavailable, Message: "this gateway replica is shutting down; retry"}
	case s.inflight >= s.opts.MaxInFlight:
		return nil, &schemas.SubmitError{Code: schemas.ErrUnavailable,
			Message: fmt.Sprintf("this gateway replica is at its limit of %d requests in flight; retry", s.opts.MaxInFlight)}
	case id != "" && s.byID[id] != nil:
		return nil, &schemas.SubmitError{Code: schemas.ErrInvalidRequest,
			Message: "request id " + id + " is already in use by a request in flight"}
	}
	if _, ok := s.canceled[id]; ok && id != "" {
		delete(s.canceled, id)
		return nil, nil
	}
	c := &natsCall{reply: reply, id: id}
	if id != "" {
		s.byID[id] = c
	}
	s.inflight++
	s.calls.Add(1)
	return c, nil
}

// release forgets a finished call.
func (s *NATSService) release(c *natsCall) {
	s.mu.Lock()
	if c.id != "" && s.byID[c.id] == c {
		delete(s.byID, c.id)
	}
	if c.token != "" {
		delete(s.byProbe, c.token)
	}
	s.inflight--
	s.mu.Unlock()
	s.calls.Done()
}

// handleCancel cancels the request named by the subject's last token, or
// remembers the cancel for a while in case it overtook its request.
func (s *NATSService) handleCancel(req micro.Request) {
	id := strings.TrimPrefix(req.Subject(), schemas.SubmitCancelPrefix)
	if !schemas.ValidSubmitRequestID(id) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.byID[id]; c != nil {
		if c.cancel != nil {
			c.cancel()
		} else {
			s.canceled[id] = time.Now() // admitted, not yet running: serve looks here
		}
		return
	}
	now := time.Now()
	if len(s.canceled) >= cancelMemoryCap {
		for k, at := range s.canceled {
			if now.Sub(at) > cancelMemory {
				delete(s.canceled, k)
			}
		}
	}
	if len(s.canceled) < cancelMemoryCap {
		s.canceled[id] = now
	}
}

// onProbe cancels a streaming call whose caller's inbox has no subscriber:
// the NATS server's no-responders status came back for one of its chunks.
func (s *NATSService) onProbe(m *nats.Msg) {
	if len(m.Data) != 0 || m.Header.Get("Status") != "503" {
		return
	}
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	s.mu.Lock()
	c := s.byProbe[token]
	s.mu.Unlock()
	if c != nil {
		c.cancel()
	}
}

// serve runs one request to its answer.
func (s *NATSService) serve(c *natsCall, data []byte) {
	defer s.release(c)
	sub, serr := s.submission(data)
	if serr != nil {
		s.fail(c.reply, serr, "")
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sink Sink
	s.mu.Lock()
	c.cancel = cancel
	if _, ok := s.canceled[c.id]; ok && c.id != "" {
		// Cancelled between its admission and now: run no group at all.
		delete(s.canceled, c.id)
		s.mu.Unlock()
		return
	}
	if sub.Request.Stream {
		s.nextCall++
		c.token = strconv.FormatUint(s.nextCall, 36)
		s.byProbe[c.token] = c
		sink = &natsSink{nc: s.nc, subject: c.reply, probe: s.probePrefix + "." + c.token}
	}
	s.mu.Unlock()

	resp, err := s.d.Submit(ctx, sub, sink)
	if err != nil {
		if ctx.Err() != nil {
			return // the caller cancelled or went away: nobody is left to tell
		}
		serr, group := s.submitError(err)
		if serr == nil {
			return
		}
		s.fail(c.reply, serr, group)
		return
	}
	s.answer(c.reply, submitResponse(resp))
}

// submission reads and checks a request: its version, its schema, then the
// Submission it asks for.
func (s *NATSService) submission(data []byte) (Submission, *schemas.SubmitError) {
	var req schemas.SubmitRequest
	if err := schemas.Decode(data, &req); err != nil {
		return Submission{}, &schemas.SubmitError{Code: schemas.ErrInvalidRequest, Message: "the request is not a version-1 submit request: " + err.Error()}
	}
	if err := schemas.Validate(schemas.KindSubmitRequest, data); err != nil {
		return Submission{}, &schemas.SubmitError{Code: schemas.ErrInvalidRequest, Message: "the request does not match the submit_request schema: " + err.Error()}
	}
	sub := Submission{
		Operation: req.OperationClass, Pool: req.ModelClass, Tenant: s.opts.Tenant,
		IdempotencyKey: req.IdempotencyKey, Request: req.Request,
	}
	if req.DeadlineMs > 0 {
		sub.Deadline = time.Duration(min(req.DeadlineMs, maxNATSDeadline.Milliseconds())) * time.Millisecond
	}
	return sub, nil
}

// submitError maps an error of Submit to its answer and the group it names;
// nil means the caller is gone and nothing is to be sent.
func (s *NATSService) submitError(err error) (*schemas.SubmitError, string) {
	var ge *GroupError
	switch {
	case errors.Is(err, context.Canceled):
		return nil, ""
	case errors.Is(err, ErrUnknownPool):
		return &schemas.SubmitError{Code: schemas.ErrUnknownModel,
			Message: "model_class names no pool of this gateway: " + strings.TrimPrefix(err.Error(), ErrUnknownPool.Error()+": ")}, ""
	case errors.Is(err, ErrBadRequest):
		return &schemas.SubmitError{Code: schemas.ErrInvalidRequest, Message: err.Error()}, ""
	case errors.Is(err, ErrShuttingDown):
		return &schemas.SubmitError{Code: schemas.ErrUnavailable, Message: "this gateway replica is shutting down; retry"}, ""
	case errors.As(err, &ge):
		if ge.Code == schemas.ErrCanceled {
			return nil, ""
		}
		se := &schemas.SubmitError{Code: ge.Code, Message: groupErrorMessage(ge.Code)}
		if ge.Holder != "" {
			if gv, perr := arbiter.ParseGateValue(ge.Holder); perr == nil {
				se.Winner = &schemas.GateValue{GroupID: gv.Group, Attempt: gv.Attempt, Epoch: gv.Epoch}
			}
			se.Message += ": " + ge.Holder
		}
		return se, ge.Group
	}
	s.log.Warn("nats submit failed", "err", err)
	return &schemas.SubmitError{Code: schemas.ErrUnavailable, Message: "the gateway failed to serve the request"}, ""
}

// groupErrorMessage says what a group error code means to the caller, in
// the HTTP front door's words.
func groupErrorMessage(code schemas.ErrorCode) string {
	switch code {
	case schemas.ErrDeadlineExceeded:
		return "no valid answer arrived before the deadline"
	case schemas.ErrAlreadyCommitted:
		return "another request of this user action (idempotency_key) already committed an answer"
	case schemas.ErrRateLimited:
		return "every route of the model is asking for less load; retry later"
	case schemas.ErrBudgetExhausted:
		return "the attempt or spend budget of this user action or tenant is exhausted"
	case schemas.ErrAllRoutesFailed, schemas.ErrRouteFailed, schemas.ErrNoRoute:
		return "no route of the model could produce a valid answer"
	case schemas.ErrInvalidRequest:
		return "the provider rejected the request as invalid"
	}
	return "the request failed"
}

// NATSErrorStatus is the HTTP-like status the NATS front door puts in the
// micro error header (Nats-Service-Error-Code) for an error code: the
// status the HTTP front door answers for the same failure.
func NATSErrorStatus(code schemas.ErrorCode) int {
	switch code {
	case schemas.ErrInvalidRequest:
		return 400
	case schemas.ErrUnknownModel:
		return 404
	case schemas.ErrAlreadyCommitted:
		return 409
	case schemas.ErrBudgetExhausted, schemas.ErrRateLimited:
		return 429
	case schemas.ErrCanceled:
		return 499 // nginx's "client closed request", as the HTTP front door logs it
	case schemas.ErrDeadlineExceeded:
		return 504
	case schemas.ErrNoRoute, schemas.ErrRouteFailed, schemas.ErrAllRoutesFailed, schemas.ErrUnavailable:
		return 503
	}
	return 500
}

// submitResponse is the wire form of a committed answer. The dispatcher's
// Response carries the winner's usage only, so TotalUsage is the winner's
// too: the losers' usage is in their attempt records.
func submitResponse(r *Response) schemas.SubmitResponse {
	out := schemas.SubmitResponse{
		UserActionID: r.UserActionID, GroupID: r.GroupID,
		Content: r.Content, FinishReason: r.FinishReason,
		Usage: r.Usage, TotalUsage: r.Usage,
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

// answer sends the final message of a success.
func (s *NATSService) answer(reply string, resp schemas.SubmitResponse) {
	data, err := json.Marshal(resp)
	if err != nil {
		s.log.Warn("nats submit answer not encoded", "err", err)
		s.fail(reply, &schemas.SubmitError{Code: schemas.ErrUnavailable, Message: "the answer could not be encoded"}, resp.GroupID)
		return
	}
	msg := &nats.Msg{Subject: reply, Header: nats.Header{schemas.HeaderStatus: {schemas.StatusDone}}, Data: data}
	if err := s.nc.PublishMsg(msg); err != nil {
		s.log.Debug("nats submit answer not sent", "err", err)
	}
}

// fail sends the final message of a failure: the micro error headers, the
// stable code, and the SubmitError as the body.
func (s *NATSService) fail(reply string, se *schemas.SubmitError, group string) {
	se.Message = headerSafe(se.Message)
	data, err := json.Marshal(se)
	if err != nil {
		data = nil
	}
	h := nats.Header{}
	h.Set(micro.ErrorCodeHeader, strconv.Itoa(NATSErrorStatus(se.Code)))
	h.Set(micro.ErrorHeader, se.Message)
	h.Set(schemas.HeaderStatus, schemas.StatusError)
	h.Set(schemas.HeaderErrorCode, string(se.Code))
	if group != "" {
		h.Set(schemas.HeaderGroup, group)
	}
	if err := s.nc.PublishMsg(&nats.Msg{Subject: reply, Header: h, Data: data}); err != nil {
		s.log.Debug("nats submit error not sent", "err", err)
	}
}

// headerSafe makes a message fit one header line of bounded length.
func headerSafe(msg string) string {
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > maxNATSErrorMessage {
		msg = msg[:maxNATSErrorMessage-3] + "..."
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
}

// Delta sends one chunk; an error means the connection is gone, which
// cancels the group.
func (k *natsSink) Delta(d Delta) error {
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
	return nil
}
