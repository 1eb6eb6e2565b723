// Package httpdoor is hedgerow's HTTP front door: OpenAI chat completions,
// OpenAI Responses and Anthropic messages, streaming or not, on one shared submit-and-stream
// path, plus models, health, readiness and metrics. It reads a caller's
// request into a dispatcher.Submission for its frontdoor.Submitter and
// answers in the caller's dialect from the error table of package frontdoor.
package httpdoor

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/schemas"
)

// hedgeHeaders are the response headers that describe the commit; a stream
// whose commit is not known when its first byte goes out sends them as
// trailers instead.
var hedgeHeaders = []string{frontdoor.HeaderAttempts, frontdoor.HeaderHedged, frontdoor.HeaderWinnerRoute, frontdoor.HeaderGate}

// Defaults of the optional Options fields.
const (
	DefaultBodyLimit        = 4 << 20
	DefaultHeaderLimit      = 64 << 10
	DefaultReadyProbeWindow = 250 * time.Millisecond
	DefaultReadyCacheTTL    = time.Second
)

// Options wire the HTTP front door to what it needs beyond its Submitter:
// the NATS connection and pool routes that readiness checks, the metrics it
// serves, the tenants' keys and its limits.
type Options struct {
	// Conn is the NATS connection readiness checks and pings workers on;
	// nil makes /readyz always fail.
	Conn *nats.Conn
	// Region is the supercluster region whose workers /readyz pings
	// (schemas.Wire.WorkerServiceName); empty: a deployment of one region.
	Region string
	// Pools maps each pool to its routes. Required. A pool none of whose
	// routes has a live worker is reported (StatusPath, /readyz's body,
	// hedgerow_pool_without_workers) but leaves the door ready: its
	// requests are answered 503 no_workers while other pools answer.
	Pools map[string][]string
	// OwnWorkers maps the worker ids of the process's own in-process
	// workers (serve's) to their routes: /readyz is ready only once each
	// answers the ping. Empty for a gateway, whose workers are other
	// processes'.
	OwnWorkers map[string]string
	// Gatherer is served on /metrics; nil serves no metrics (404).
	Gatherer prometheus.Gatherer
	// Registerer, when set, receives the door's own metrics: the pools'
	// hedgerow_pool_without_workers gauge, read through the readiness
	// check at each scrape.
	Registerer prometheus.Registerer
	// BodyLimit is the largest request body accepted; zero means
	// DefaultBodyLimit. It must fit in one NATS message with the attempt
	// envelope, which configuration validation checks.
	BodyLimit int64
	// HeaderLimit is the largest header block (request target, names and
	// values) accepted; zero means DefaultHeaderLimit. Over it is a 431 in
	// the caller's dialect. The http.Server's MaxHeaderBytes must be
	// larger, or net/http answers first with its own plain-text 431.
	HeaderLimit int
	// Keyring authenticates callers by their API key. Nil means no API key
	// is required (local use).
	Keyring *frontdoor.Keyring
	// Limiter applies each tenant's request rate and requests in flight
	// once the caller is authenticated, before anything runs: over a limit
	// is a 429 with Retry-After. Nil limits nothing.
	Limiter frontdoor.TenantLimiter
	// EmbeddingPools are the pools that serve POST /v1/embeddings (a
	// pool's kind); /v1/models lists them after the chat pools. An
	// embeddings request naming another pool is refused naming model.
	EmbeddingPools []string
	// ReadyProbeWindow is how long a readiness check collects worker pings
	// before it names the pools nobody answered for.
	ReadyProbeWindow time.Duration
	// ReadyCacheTTL is how long a readiness result is reused, so probes
	// cannot flood NATS.
	ReadyCacheTTL time.Duration
	// Replays keeps the committed answers of user actions and the
	// in-flight markers of the running ones: a request naming the
	// Idempotency-Key of one in flight — on this door or a replica sharing
	// the store — joins it, one naming a committed one gets its answer
	// replayed, and one whose gateway died mid-flight is taken over
	// (docs/architecture.md §2). Nil turns all off: a retry then meets the
	// winner gate (409).
	Replays replay.Store
	// ReplayTTL is how long a committed answer is replayed; zero means
	// replay.DefaultTTL.
	ReplayTTL time.Duration
	// ReplayMaxBytes bounds the bytes recorded of one answer; a larger
	// answer is not kept. Zero means replay.DefaultMaxEntryBytes.
	ReplayMaxBytes int
	// ReplayLease is the lease of a request's in-flight marker in Replays
	// (replay.Flights): a request of another replica whose marker went
	// unrefreshed this long with no answer was orphaned, and a retry takes
	// it over. Zero means replay.DefaultLease.
	ReplayLease time.Duration
	// Elsewhere is the index of the user actions other regions committed
	// (replay.FlightOptions.Elsewhere, docs/architecture.md §14); nil in a
	// deployment of one region.
	Elsewhere replay.Elsewhere
	// ReplayMetrics count the committed answers not kept in Replays
	// (replay.FlightOptions.Metrics); nil counts none. A gateway's one,
	// shared by both doors and every generation.
	ReplayMetrics *replay.Metrics
	Logger        *slog.Logger
	// Records, when set, serves the report endpoints (ReportPath,
	// RecordsPath, report.go) from the kept records; nil serves neither.
	Records RecordSource
	// ReportTenants are the tenants whose keys may read them; with no
	// Keyring (no key required) anyone may.
	ReportTenants map[string]bool
	// Now is the clock of the created stamps and the readiness cache; nil
	// means time.Now.
	Now func() time.Time
}

// handler is the HTTP front door of one Submitter.
type handler struct {
	d     frontdoor.Submitter
	opts  Options
	log   *slog.Logger
	now   func() time.Time
	ready *readiness
	mux   *http.ServeMux
	// flights are the user actions in flight, here and on the replicas
	// sharing Replays, which a request of the same key joins
	// (idempotency.go); nil without Replays.
	flights *replay.Flights
	// embeddingModel says, for every model name callers may send, whether
	// its pool serves embeddings: indexed once, since the Submitter's
	// models do not change, so a request never scans the listing.
	embeddingModel map[string]bool
}

// New returns the HTTP front door of d:
//
//	POST /v1/chat/completions   OpenAI chat completions, streaming or not
//	POST /v1/messages           Anthropic Messages, streaming or not
//	POST /v1/responses          OpenAI Responses, streaming or not
//	POST /v1/embeddings         OpenAI embeddings, never streaming
//	GET  /v1/models             every model name: chat pools' names and aliases, then embedding pools' (a key when keys are required)
//	GET  /v1/models/{model}     one of them (a name may hold slashes; a key when keys are required)
//	GET  /healthz               200 while the process serves
//	GET  /readyz                200 when this gateway can serve: NATS connected (and, in serve, its own workers registered)
//	GET  /v1/hedgerow/status    readiness and each pool's routes and whether a live worker serves it (ready.go)
//	GET  /metrics               Prometheus exposition of opts.Gatherer
//	GET  /v1/hedgerow/report    the records report, with opts.Records (report.go)
//	GET  /v1/hedgerow/records   the kept records as JSONL, with opts.Records
//
// Timeouts are the http.Server's: the handler expects ReadHeaderTimeout and
// ReadTimeout to bound reading the request, and a WriteTimeout of zero or at
// least the longest policy deadline, since a stream is written for as long as
// its group runs. A request's context ends when its client goes away; that
// cancels its group with no fallback. Every error is an OpenAI error object
// (an Anthropic one on /v1/messages).
//
// A stream's status line and headers go out with its first committed delta,
// so a group failing before its commit still answers with a JSON error and
// its status. The X-Hedgerow-* values of a stream are headers when the
// Submitter tells its Sink the commit first (dispatcher.CommitSink), else
// HTTP trailers after the last event.
func New(d frontdoor.Submitter, opts Options) (http.Handler, error) {
	h, err := newHandler(d, opts)
	if err != nil {
		return nil, err
	}
	h.operational(h.mux)
	return h, nil
}

// NewSplit is New with /readyz, the status and /metrics served by internal, a handler
// of their own for a listener only operators reach, instead of by api
// (which then answers them 404 unknown_url). Both serve /healthz.
func NewSplit(d frontdoor.Submitter, opts Options) (api, internal http.Handler, err error) {
	h, err := newHandler(d, opts)
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", h.only(http.MethodGet, openAIDialect{}, h.healthz))
	h.operational(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		openAIDialect{}.writeFailure(w, &frontdoor.Failure{Code: frontdoor.CodeUnknownURL,
			Message: "Unknown request URL: see /readyz and /metrics."})
	})
	return h, mux, nil
}

// operational adds readiness, status and metrics to mux.
func (h *handler) operational(mux *http.ServeMux) {
	mux.HandleFunc("/readyz", h.only(http.MethodGet, openAIDialect{}, h.readyz))
	mux.HandleFunc(StatusPath, h.only(http.MethodGet, openAIDialect{}, h.serveStatus))
	if h.opts.Gatherer != nil {
		metrics := promhttp.HandlerFor(h.opts.Gatherer, promhttp.HandlerOpts{})
		mux.HandleFunc("/metrics", h.only(http.MethodGet, openAIDialect{}, metrics.ServeHTTP))
	}
}

func newHandler(d frontdoor.Submitter, opts Options) (*handler, error) {
	if d == nil {
		return nil, errors.New("httpdoor: a submitter is required")
	}
	if len(opts.Pools) == 0 {
		return nil, errors.New("httpdoor: Pools is required: the status reports every pool")
	}
	if opts.BodyLimit < 0 || opts.HeaderLimit < 0 || opts.ReadyProbeWindow < 0 || opts.ReadyCacheTTL < 0 || opts.ReplayTTL < 0 || opts.ReplayMaxBytes < 0 || opts.ReplayLease < 0 {
		return nil, errors.New("httpdoor: body limit, probe window, cache and replay TTLs and replay size must not be negative")
	}
	opts.ReplayTTL = cmp.Or(opts.ReplayTTL, replay.DefaultTTL)
	opts.ReplayMaxBytes = cmp.Or(opts.ReplayMaxBytes, replay.DefaultMaxEntryBytes)
	opts.BodyLimit = cmp.Or(opts.BodyLimit, DefaultBodyLimit)
	opts.HeaderLimit = cmp.Or(opts.HeaderLimit, DefaultHeaderLimit)
	opts.ReadyProbeWindow = cmp.Or(opts.ReadyProbeWindow, DefaultReadyProbeWindow)
	opts.ReadyCacheTTL = cmp.Or(opts.ReadyCacheTTL, DefaultReadyCacheTTL)
	h := &handler{d: d, opts: opts, log: opts.Logger, now: opts.Now, mux: http.NewServeMux()}
	if opts.Replays != nil {
		var err error
		if h.flights, err = replay.NewFlights(opts.Replays, replay.FlightOptions{Lease: opts.ReplayLease, Elsewhere: opts.Elsewhere, Metrics: opts.ReplayMetrics}); err != nil {
			return nil, fmt.Errorf("httpdoor: %w", err)
		}
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	h.ready = newReadiness(opts.Conn, schemas.RegionWire(opts.Region), opts.Pools, opts.OwnWorkers, opts.ReadyProbeWindow, opts.ReadyCacheTTL, h.now)
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(poolCollector{h.ready}); err != nil {
			return nil, fmt.Errorf("httpdoor: metrics: %w", err)
		}
	}
	h.embeddingModel = embeddingModels(d.Models(), opts.EmbeddingPools) // embeddings.go
	// Methods are checked by the handlers, not by mux patterns, so a wrong
	// method gets an error object of the dialect and not the mux's plain text.
	h.mux.HandleFunc("/v1/chat/completions", h.withRequestID(h.only(http.MethodPost, openAIDialect{}, h.serveDialect(openAIDialect{}))))
	h.mux.HandleFunc("/v1/messages", h.withRequestID(h.only(http.MethodPost, anthropicDialect{}, h.serveDialect(anthropicDialect{}))))
	h.mux.HandleFunc("/v1/responses", h.withRequestID(h.only(http.MethodPost, responsesDialect{}, h.serveDialect(responsesDialect{}))))
	h.mux.HandleFunc("/v1/embeddings", h.withRequestID(h.only(http.MethodPost, openAIDialect{}, h.serveDialect(embeddingsDialect{h: h}))))
	h.mux.HandleFunc("/v1/models", h.only(http.MethodGet, openAIDialect{}, h.withKey(h.listModels)))
	h.mux.HandleFunc("/v1/models/{model...}", h.only(http.MethodGet, openAIDialect{}, h.withKey(h.getModel)))
	h.mux.HandleFunc("/healthz", h.only(http.MethodGet, openAIDialect{}, h.healthz))
	h.reportRoutes() // report.go
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		openAIDialect{}.writeFailure(w, &frontdoor.Failure{Code: frontdoor.CodeUnknownURL,
			Message: "Unknown request URL: see /v1/chat/completions and /v1/models."})
	})
	return h, nil
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// withRequestID reserves the id of the group the request will run as
// (Submitter.NewGroupID) and sets it as the request-id and x-request-id
// headers before anything else, so that every answer — a committed one, a
// stream, a replay or a refusal — carries it; serveDialect submits the
// group under it. A request refused before its group runs carries an id
// that names no group.
func (h *handler) withRequestID(f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := h.d.NewGroupID()
		w.Header().Set(frontdoor.HeaderRequestID, id)
		w.Header().Set(frontdoor.HeaderXRequestID, id)
		f(w, r)
	}
}

// only admits one method (GET also admits HEAD), and refuses, before
// anything reads the body, a request whose headers are over HeaderLimit
// (431) or whose declared body is over BodyLimit (413), in dl's dialect.
// The connection of a refused body is closed rather than drained: reading
// 50 MiB to answer "too large" is what the limit is there to avoid.
func (h *handler) only(method string, dl dialect, f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if n := headerBytes(r); n > h.opts.HeaderLimit {
			w.Header().Set("Connection", "close")
			dl.writeFailure(w, &frontdoor.Failure{Code: frontdoor.CodeHeadersTooLarge,
				Message: fmt.Sprintf("The request's headers are larger than the limit of %d bytes.", h.opts.HeaderLimit)})
			return
		}
		if r.ContentLength > h.opts.BodyLimit {
			w.Header().Set("Connection", "close")
			dl.writeFailure(w, bodyTooLarge(h.opts.BodyLimit))
			return
		}
		if r.Method == method || method == http.MethodGet && r.Method == http.MethodHead {
			f(w, r)
			return
		}
		w.Header().Set("Allow", method)
		dl.writeFailure(w, &frontdoor.Failure{Code: frontdoor.CodeMethodNotAllowed,
			Message: "This method is not allowed here; use " + method + "."})
	}
}

// dialect is what differs between the OpenAI and the Anthropic doors: how a
// body reads, how an answer, a stream and an error are written. Everything
// else — keys, headers, limits, the submit-and-stream path — is shared.
type dialect interface {
	// parse reads a request body into the pool, the canonical request and
	// whether a stream ends with a usage chunk.
	parse(body []byte) (pool string, req schemas.ChatRequest, includeUsage bool, f *frontdoor.Failure)
	// answer is the JSON body of a committed non-streaming answer.
	answer(resp *dispatcher.Response, pool string, now time.Time) any
	// stream starts the Sink of a streaming answer; it writes nothing
	// before its first delta.
	stream(w http.ResponseWriter, pool string, now time.Time, includeUsage bool) stream
	writeFailure(w http.ResponseWriter, f *frontdoor.Failure)
}

// stream is a dialect's writer of a committed stream.
type stream interface {
	dispatcher.Sink
	// sent reports whether bytes reached the caller, and whether a write
	// failed (the caller is gone).
	sent() (started bool, writeErr error)
	// finish ends a successful stream; fail ends a started one with an
	// error event, so no client takes it for a whole answer.
	finish(resp *dispatcher.Response) error
	fail(f *frontdoor.Failure) error
}

// serveDialect is the one submit-and-stream path of both dialects. A
// request naming an Idempotency-Key goes through the replay store first
// when the door has one (idempotency.go).
func (h *handler) serveDialect(dl dialect) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sub, includeUsage, f := h.submission(w, r, dl)
		if f != nil {
			dl.writeFailure(w, f)
			return
		}
		sub.GroupID = w.Header().Get(frontdoor.HeaderRequestID) // withRequestID's
		release, f := frontdoor.AdmitTenant(r.Context(), h.opts.Limiter, sub.Tenant)
		if f != nil {
			dl.writeFailure(w, f)
			return
		}
		defer release() // on every path: answer, failure, caller gone, panic
		if h.opts.Replays != nil && sub.IdempotencyKey != "" {
			h.serveIdempotent(w, r, dl, sub, includeUsage)
			return
		}
		h.serve(w, r, dl, sub, includeUsage)
	}
}

// serve submits one request and writes its answer, its stream or its
// failure; it reports whether a committed answer was written whole.
func (h *handler) serve(w http.ResponseWriter, r *http.Request, dl dialect, sub dispatcher.Submission, includeUsage bool) bool {
	if !sub.Request.Stream {
		resp, err := h.d.Submit(r.Context(), sub, nil)
		if err != nil {
			h.writeSubmitError(w, r, dl, err)
			return false
		}
		setHedgeHeaders(w.Header(), resp)
		writeJSON(w, http.StatusOK, dl.answer(resp, sub.Pool, h.now()))
		return true
	}
	s := dl.stream(w, sub.Pool, h.now(), includeUsage)
	resp, err := h.d.Submit(r.Context(), sub, s)
	started, writeErr := s.sent()
	switch {
	case err == nil:
		if err := s.finish(resp); err != nil {
			h.log.Debug("stream not finished: client gone", "err", err)
			return false
		}
		return true
	case writeErr != nil:
		// The client went away mid-stream: nobody is left to tell.
	case !started:
		h.writeSubmitError(w, r, dl, err)
	default:
		// Bytes of the committed stream were sent: the status is spent,
		// so the stream ends with an error event.
		if f := h.failureFor(r, err); f != nil {
			if err := s.fail(f); err != nil {
				h.log.Debug("stream error event not sent: client gone", "err", err)
			}
		}
	}
	return false
}

// submission reads the caller's request: its key, its headers, then its
// body. Everything a caller can get wrong is refused here, before a group
// runs, with the offending parameter named.
func (h *handler) submission(w http.ResponseWriter, r *http.Request, dl dialect) (dispatcher.Submission, bool, *frontdoor.Failure) {
	tenant, f := h.authenticate(r)
	if f != nil {
		return dispatcher.Submission{}, false, f
	}
	hdr, f := h.readHedgeHeaders(r)
	if f != nil {
		return dispatcher.Submission{}, false, f
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.BodyLimit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			w.Header().Set("Connection", "close")
			return dispatcher.Submission{}, false, bodyTooLarge(h.opts.BodyLimit)
		}
		return dispatcher.Submission{}, false, &frontdoor.Failure{Code: frontdoor.CodeInvalidBody, Message: "The request body could not be read."}
	}
	pool, req, includeUsage, f := dl.parse(body)
	if f == nil {
		f = h.checkPoolKind(pool, req) // embeddings.go
	}
	if f != nil {
		return dispatcher.Submission{}, false, f
	}
	if limit := h.d.MaxTokens(pool); req.MaxTokens > limit && limit > 0 {
		// Past the pool's limit a figure could only fail upstream, and
		// it would be reserved against the spend ceilings as sent.
		return dispatcher.Submission{}, false, frontdoor.MaxTokensOver(maxTokensParam(dl, req), limit)
	}
	if len(req.ResponseFormat) > 0 {
		// The dispatcher judges answers by this contract; a schema that
		// does not compile is the caller's to fix, so it is refused here
		// with its parameter named rather than failing the group.
		if err := h.d.CheckResponseFormat(r.Context(), tenant, pool, req.ResponseFormat); err != nil {
			f := responseFormatFailure(pool, err)
			if rd, ok := dl.(responsesDialect); ok {
				f = rd.formatParam(f)
			}
			return dispatcher.Submission{}, false, f
		}
	}
	sub := hdr
	sub.Pool, sub.Request, sub.Tenant = pool, req, tenant
	return sub, includeUsage, nil
}

// maxTokensParam names the member a request's output limit came from in
// its dialect.
func maxTokensParam(dl dialect, req schemas.ChatRequest) string {
	switch {
	case isResponses(dl):
		return "max_output_tokens"
	case req.MaxTokensField == schemas.ParamMaxCompletionTokens:
		return schemas.ParamMaxCompletionTokens
	}
	return schemas.ParamMaxTokens
}

func isResponses(dl dialect) bool {
	_, ok := dl.(responsesDialect)
	return ok
}

// bodyTooLarge answers a body over the limit: 413, whether its
// Content-Length said so or reading it found out (chunked).
func bodyTooLarge(limit int64) *frontdoor.Failure {
	return &frontdoor.Failure{Code: frontdoor.CodeRequestTooLarge,
		Message: fmt.Sprintf("The request body is larger than the limit of %d bytes.", limit)}
}

// headerBytes is the size of a request's header block as sent, near
// enough: the request line's target and every field's name and value with
// their separators.
func headerBytes(r *http.Request) int {
	n := len(r.RequestURI)
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// readHedgeHeaders reads the user action, the operation class and the
// deadline the caller asked for.
func (h *handler) readHedgeHeaders(r *http.Request) (dispatcher.Submission, *frontdoor.Failure) {
	var sub dispatcher.Submission
	if sub.IdempotencyKey = r.Header.Get(frontdoor.HeaderIdempotencyKey); len(sub.IdempotencyKey) > frontdoor.MaxIdempotencyKeyLen {
		return sub, frontdoor.InvalidParam(frontdoor.HeaderIdempotencyKey,
			fmt.Sprintf("The %s header is longer than %d bytes.", frontdoor.HeaderIdempotencyKey, frontdoor.MaxIdempotencyKeyLen))
	}
	sub.TraceParent = frontdoor.TraceParent(r.Header.Get(frontdoor.HeaderTraceParent))
	sub.Operation = r.Header.Get(frontdoor.HeaderOperation)
	if len(sub.Operation) > frontdoor.MaxOperationLen {
		return sub, frontdoor.InvalidParam(frontdoor.HeaderOperation,
			fmt.Sprintf("The %s header is longer than %d bytes.", frontdoor.HeaderOperation, frontdoor.MaxOperationLen))
	}
	if sub.Operation != "" && !h.d.HasOperation(sub.Operation) {
		return sub, frontdoor.InvalidParam(frontdoor.HeaderOperation,
			"The "+frontdoor.HeaderOperation+" header names no configured operation class.")
	}
	if v := r.Header.Get(frontdoor.HeaderDeadlineMs); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 {
			return sub, frontdoor.InvalidParam(frontdoor.HeaderDeadlineMs,
				"The "+frontdoor.HeaderDeadlineMs+" header must be a positive integer number of milliseconds.")
		}
		sub.Deadline = frontdoor.CallerDeadline(ms)
	}
	return sub, nil
}

// authenticate maps the caller's API key to its tenant when keys are
// required. The key itself never appears in an answer or a log.
func (h *handler) authenticate(r *http.Request) (string, *frontdoor.Failure) {
	if h.opts.Keyring == nil {
		return "", nil
	}
	if key := presentedKey(r); key != "" {
		if tenant, ok := h.opts.Keyring.Tenant(key); ok {
			return tenant, nil
		}
	}
	return "", &frontdoor.Failure{Code: frontdoor.CodeInvalidAPIKey,
		Message: "A valid API key is required in the Authorization header as 'Bearer <key>'."}
}

// withKey serves f only to a caller with a valid API key when keys are
// required (401 invalid_api_key otherwise, as on every endpoint that runs a
// group): the models a deployment serves are its callers' business.
func (h *handler) withKey(f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if _, fail := h.authenticate(r); fail != nil {
			openAIDialect{}.writeFailure(w, fail)
			return
		}
		f(w, r)
	}
}

// presentedKey is the caller's API key: the bearer token of the
// Authorization header (the scheme in any case, as RFC 9110 allows), else
// the x-api-key header Anthropic clients send.
func presentedKey(r *http.Request) string {
	if scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " "); ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(token)
	}
	return strings.TrimSpace(r.Header.Get("X-Api-Key"))
}

// writeSubmitError answers a failure that came before any byte was sent.
func (h *handler) writeSubmitError(w http.ResponseWriter, r *http.Request, dl dialect, err error) {
	f := h.failureFor(r, err)
	if f == nil {
		// The client went away; the status is only for access logs.
		w.WriteHeader(frontdoor.StatusClientClosedRequest)
		return
	}
	dl.writeFailure(w, f)
}

// failureFor maps a Submit error to its answer; nil means the client is
// gone and nothing is to be written.
func (h *handler) failureFor(r *http.Request, err error) *frontdoor.Failure {
	if r.Context().Err() != nil {
		return nil
	}
	f := frontdoor.FailureFor(err)
	if f != nil && f.Code == frontdoor.CodeInternal {
		h.log.Warn("request failed", "err", err)
	}
	return f
}

// listModels lists every model name callers may send, as the Submitter
// orders them: the chat models, each pool's own name then its aliases.
// Models of other kinds (embeddings, when a door serves them) are to be
// appended after the chat models, so clients that take the first entry
// still get a chat model.
func (h *handler) listModels(w http.ResponseWriter, r *http.Request) {
	models := h.d.Models()
	embeddingsLast(models, h.embeddingModel) // embeddings.go
	list := modelList{Object: "list", Data: make([]model, 0, len(models))}
	for _, m := range models {
		list.Data = append(list.Data, newModel(m.Name))
	}
	writeJSON(w, http.StatusOK, list)
}

func (h *handler) getModel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	if !slices.ContainsFunc(h.d.Models(), func(m dispatcher.Model) bool { return m.Name == name }) {
		openAIDialect{}.writeFailure(w, frontdoor.ModelNotFound(name))
		return
	}
	writeJSON(w, http.StatusOK, newModel(name))
}

func (h *handler) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// setHedgeHeaders writes how the answer was won.
func setHedgeHeaders(h http.Header, resp *dispatcher.Response) {
	h.Set(frontdoor.HeaderAttempts, strconv.Itoa(resp.Attempts))
	h.Set(frontdoor.HeaderHedged, strconv.FormatBool(resp.Hedged))
	h.Set(frontdoor.HeaderWinnerRoute, resp.WinnerRoute)
	h.Set(frontdoor.HeaderGate, resp.Gate)
}

// setFailureHeaders writes the headers every dialect sends with an error:
// whether to retry (always) and when, the committed winner, and a challenge.
func setFailureHeaders(h http.Header, f *frontdoor.Failure) {
	if v := f.RetryAfterHeader(); v != "" {
		h.Set("Retry-After", v)
	}
	if f.Holder != "" {
		h.Set(frontdoor.HeaderGate, f.Holder)
	}
	if f.Region != "" {
		h.Set(frontdoor.HeaderRegion, f.Region)
	}
	// The OpenAI and Anthropic SDKs obey it over their own status rules.
	h.Set(frontdoor.HeaderShouldRetry, strconv.FormatBool(f.ShouldRetry()))
	if f.Code == frontdoor.CodeInvalidAPIKey {
		h.Set("WWW-Authenticate", `Bearer realm="hedgerow"`)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		data = []byte(`{"error":{"message":"The response could not be encoded.","type":"server_error","param":null,"code":"internal_error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

// randomID is a random id suffix, for a stream that starts before its group
// is known.
func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
