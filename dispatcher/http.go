package dispatcher

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hedgerow/hedgerow/dispatcher/policy"
)

// Headers of the HTTP front door. Callers name the user action and the
// policy class and may shorten the deadline; responses say how the answer
// was won.
const (
	HeaderIdempotencyKey = "Idempotency-Key"
	HeaderOperation      = "X-Hedgerow-Operation"
	HeaderDeadlineMs     = "X-Hedgerow-Deadline-Ms"
	HeaderAttempts       = "X-Hedgerow-Attempts"
	HeaderHedged         = "X-Hedgerow-Hedged"
	HeaderWinnerRoute    = "X-Hedgerow-Winner-Route"
	HeaderGate           = "X-Hedgerow-Gate"
)

// hedgeHeaders are the response headers that describe the commit; a stream
// whose commit is not known when its first byte goes out sends them as
// trailers instead.
var hedgeHeaders = []string{HeaderAttempts, HeaderHedged, HeaderWinnerRoute, HeaderGate}

// Defaults of the optional HTTPOptions fields.
const (
	DefaultBodyLimit        = 4 << 20
	DefaultReadyProbeWindow = 250 * time.Millisecond
	DefaultReadyCacheTTL    = time.Second
)

// Bounds of caller-chosen header values: long enough for any sane use, short
// enough that they cannot be used to make the gateway hash megabytes.
const (
	maxIdempotencyKeyLen = 255
	maxOperationLen      = 128
	maxDeadline          = 24 * time.Hour
)

// HTTPOptions wires the HTTP front door to what it needs beyond the
// Dispatcher: the NATS connection and pool routes that readiness checks, the
// metrics it serves, and its limits.
type HTTPOptions struct {
	// Conn is the NATS connection readiness checks and pings workers on;
	// nil makes /readyz always fail.
	Conn *nats.Conn
	// Pools maps each pool to its routes (see PoolRoutes): /readyz needs a
	// live worker for at least one route of every pool. Required.
	Pools map[string][]string
	// Gatherer is served on /metrics; nil serves no metrics (404).
	Gatherer prometheus.Gatherer
	// BodyLimit is the largest request body accepted; zero means
	// DefaultBodyLimit. It must fit in one NATS message with the attempt
	// envelope, which configuration validation checks.
	BodyLimit int64
	// TenantByKeyHash authenticates callers: it maps policy.HashAPIKey of the
	// bearer key to a tenant (TenantKeyring builds it from the configured
	// tenants). Nil means no API key is required (local use).
	TenantByKeyHash func(hash string) (tenant string, ok bool)
	// ReadyProbeWindow is how long a readiness check collects worker pings
	// before it names the pools nobody answered for.
	ReadyProbeWindow time.Duration
	// ReadyCacheTTL is how long a readiness result is reused, so probes
	// cannot flood NATS.
	ReadyCacheTTL time.Duration
	Logger        *slog.Logger
	// Now is the clock of the created stamps and the readiness cache; nil
	// means time.Now.
	Now func() time.Time
}

// PoolRoutes lists each pool's routes, the shape HTTPOptions.Pools takes.
func PoolRoutes(pools map[string]Pool) map[string][]string {
	out := make(map[string][]string, len(pools))
	for name, p := range pools {
		out[name] = slices.Clone(p.Routes)
	}
	return out
}

// TenantKeyring returns the tenant lookup HTTPOptions.TenantByKeyHash takes,
// for the configured tenants. A lookup compares the presented hash with every
// configured one in constant time and never stops early, so how long it takes
// says nothing about how close a guess came. Nil or empty tenants give a
// lookup that admits nobody.
func TenantKeyring(tenants map[string]*policy.Tenant) func(hash string) (string, bool) {
	type key struct {
		hash   []byte
		tenant string
	}
	var keys []key
	for _, name := range slices.Sorted(maps.Keys(tenants)) {
		if tenants[name] == nil {
			continue
		}
		for _, h := range tenants[name].APIKeyHashes {
			keys = append(keys, key{hash: []byte(h), tenant: name})
		}
	}
	return func(hash string) (string, bool) {
		presented := []byte(hash)
		found := -1
		for i, k := range keys {
			// Configured hashes are unique (configuration validation), so
			// at most one matches; every one is compared regardless.
			if subtle.ConstantTimeCompare(presented, k.hash) == 1 {
				found = i
			}
		}
		if found < 0 {
			return "", false
		}
		return keys[found].tenant, true
	}
}

// httpHandler is the OpenAI-compatible front door of one Dispatcher.
type httpHandler struct {
	d     *Dispatcher
	opts  HTTPOptions
	log   *slog.Logger
	now   func() time.Time
	ready *readiness
	mux   *http.ServeMux
}

// NewHTTPHandler returns the HTTP front door of d:
//
//	POST /v1/chat/completions   OpenAI chat completions, streaming or not
//	POST /v1/messages           Anthropic Messages, streaming or not
//	GET  /v1/models             the pools, as OpenAI models
//	GET  /v1/models/{model}     one pool
//	GET  /healthz               200 while the process serves
//	GET  /readyz                200 when NATS is connected and every pool has a live worker
//	GET  /metrics               Prometheus exposition of opts.Gatherer
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
// dispatcher tells its Sink the commit first (a Committed(*Response) method),
// else HTTP trailers after the last event.
func NewHTTPHandler(d *Dispatcher, opts HTTPOptions) (http.Handler, error) {
	if d == nil {
		return nil, errors.New("http front door: dispatcher is required")
	}
	if len(opts.Pools) == 0 {
		return nil, errors.New("http front door: Pools is required (see PoolRoutes): readiness checks every pool")
	}
	if opts.BodyLimit < 0 || opts.ReadyProbeWindow < 0 || opts.ReadyCacheTTL < 0 {
		return nil, errors.New("http front door: body limit, probe window and cache TTL must not be negative")
	}
	if opts.BodyLimit == 0 {
		opts.BodyLimit = DefaultBodyLimit
	}
	if opts.ReadyProbeWindow == 0 {
		opts.ReadyProbeWindow = DefaultReadyProbeWindow
	}
	if opts.ReadyCacheTTL == 0 {
		opts.ReadyCacheTTL = DefaultReadyCacheTTL
	}
	h := &httpHandler{d: d, opts: opts, log: opts.Logger, now: opts.Now, mux: http.NewServeMux()}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	h.ready = newReadiness(opts.Conn, opts.Pools, opts.ReadyProbeWindow, opts.ReadyCacheTTL, h.now)
	// Methods are checked by the handlers, not by mux patterns, so a wrong
	// method gets an OpenAI error object and not the mux's plain text.
	h.mux.HandleFunc("/v1/chat/completions", only(http.MethodPost, h.chatCompletions))
	h.mux.HandleFunc("/v1/messages", h.messages) // Anthropic Messages; answers its own method errors
	h.mux.HandleFunc("/v1/models", only(http.MethodGet, h.listModels))
	h.mux.HandleFunc("/v1/models/{model}", only(http.MethodGet, h.getModel))
	h.mux.HandleFunc("/healthz", only(http.MethodGet, h.healthz))
	h.mux.HandleFunc("/readyz", only(http.MethodGet, h.readyz))
	if opts.Gatherer != nil {
		metrics := promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{})
		h.mux.HandleFunc("/metrics", only(http.MethodGet, metrics.ServeHTTP))
	}
	h.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeAPIError(w, &apiError{status: http.StatusNotFound, Type: typeInvalidRequest, Code: "unknown_url",
			Message: "Unknown request URL: see /v1/chat/completions and /v1/models."})
	})
	return h, nil
}

func (h *httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// only admits one method (GET also admits HEAD).
func only(method string, f http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method == method || method == http.MethodGet && r.Method == http.MethodHead {
			f(w, r)
			return
		}
		w.Header().Set("Allow", method)
		writeAPIError(w, &apiError{status: http.StatusMethodNotAllowed, Type: typeInvalidRequest, Code: "method_not_allowed",
			Message: "This method is not allowed here; use " + method + "."})
	}
}

func (h *httpHandler) chatCompletions(w http.ResponseWriter, r *http.Request) {
	sub, includeUsage, aerr := h.submission(w, r)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if !sub.Request.Stream {
		resp, err := h.d.Submit(r.Context(), sub, nil)
		if err != nil {
			h.writeSubmitError(w, r, err)
			return
		}
		setHedgeHeaders(w.Header(), resp)
		writeJSON(w, http.StatusOK, newChatCompletion(resp, sub.Pool, h.now()))
		return
	}
	s := &sseStream{w: w, rc: http.NewResponseController(w), model: sub.Pool, created: h.now().Unix(), includeUsage: includeUsage}
	resp, err := h.d.Submit(r.Context(), sub, s)
	switch {
	case err == nil:
		if err := s.finish(resp); err != nil {
			h.log.Debug("stream not finished: client gone", "err", err)
		}
	case s.writeErr != nil:
		// The client went away mid-stream: nobody is left to tell.
	case !s.started:
		h.writeSubmitError(w, r, err)
	default:
		// Bytes of the committed stream were sent: the status is spent, so
		// the stream ends with an error event and without [DONE].
		aerr := h.apiErrorFor(r, err)
		if aerr == nil {
			return
		}
		if err := s.fail(aerr); err != nil {
			h.log.Debug("stream error event not sent: client gone", "err", err)
		}
	}
}

// submission reads the caller's request: its key, its headers, then its
// body. Everything a caller can get wrong is refused here, before a group
// runs, with the offending parameter named.
func (h *httpHandler) submission(w http.ResponseWriter, r *http.Request) (Submission, bool, *apiError) {
	var sub Submission
	tenant, aerr := h.authenticate(r)
	if aerr != nil {
		return sub, false, aerr
	}
	sub.Tenant = tenant
	if aerr := h.readHedgeHeaders(r, &sub); aerr != nil {
		return sub, false, aerr
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opts.BodyLimit))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return sub, false, &apiError{status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest, Code: "request_too_large",
				Message: fmt.Sprintf("The request body is larger than the limit of %d bytes.", h.opts.BodyLimit)}
		}
		return sub, false, &apiError{status: http.StatusBadRequest, Type: typeInvalidRequest, Code: "invalid_body",
			Message: "The request body could not be read."}
	}
	pool, req, includeUsage, aerr := parseChatRequest(body)
	if aerr != nil {
		return sub, false, aerr
	}
	if len(req.ResponseFormat) > 0 {
		// The dispatcher judges answers by this contract; a schema that
		// does not compile is the caller's to fix, so it is refused here
		// with its parameter named rather than failing the group.
		if _, err := h.d.contractFor(pool, req.ResponseFormat); err != nil {
			return sub, false, responseFormatError(err)
		}
	}
	sub.Pool, sub.Request = pool, req
	return sub, includeUsage, nil
}

// readHedgeHeaders reads the user action, the operation class and the
// deadline the caller asked for.
func (h *httpHandler) readHedgeHeaders(r *http.Request, sub *Submission) *apiError {
	if sub.IdempotencyKey = r.Header.Get(HeaderIdempotencyKey); len(sub.IdempotencyKey) > maxIdempotencyKeyLen {
		return invalidParam(HeaderIdempotencyKey, fmt.Sprintf("The %s header is longer than %d bytes.", HeaderIdempotencyKey, maxIdempotencyKeyLen))
	}
	sub.Operation = r.Header.Get(HeaderOperation)
	if len(sub.Operation) > maxOperationLen {
		return invalidParam(HeaderOperation, fmt.Sprintf("The %s header is longer than %d bytes.", HeaderOperation, maxOperationLen))
	}
	if sub.Operation != "" && !h.d.HasPolicy(sub.Operation) {
		// An unknown class would silently run under the default policy,
		// with another deadline and hedging rule than the caller chose.
		return invalidParam(HeaderOperation, "The "+HeaderOperation+" header names no configured operation class.")
	}
	if v := r.Header.Get(HeaderDeadlineMs); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 {
			return invalidParam(HeaderDeadlineMs, "The "+HeaderDeadlineMs+" header must be a positive integer number of milliseconds.")
		}
		// The dispatcher never lengthens the policy's deadline, so a huge
		// value only needs to stay clear of overflow.
		sub.Deadline = time.Duration(min(ms, maxDeadline.Milliseconds())) * time.Millisecond
	}
	return nil
}

// authenticate maps the caller's API key to its tenant when keys are
// required. The key itself never appears in an answer or a log.
func (h *httpHandler) authenticate(r *http.Request) (string, *apiError) {
	if h.opts.TenantByKeyHash == nil {
		return "", nil
	}
	if key := presentedKey(r); key != "" {
		if tenant, ok := h.opts.TenantByKeyHash(policy.HashAPIKey(key)); ok {
			return tenant, nil
		}
	}
	return "", &apiError{status: http.StatusUnauthorized, Type: "authentication_error", Code: "invalid_api_key", challenge: true,
		Message: "A valid API key is required in the Authorization header as 'Bearer <key>'."}
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
func (h *httpHandler) writeSubmitError(w http.ResponseWriter, r *http.Request, err error) {
	aerr := h.apiErrorFor(r, err)
	if aerr == nil {
		// The client went away; the status is only for access logs.
		w.WriteHeader(statusClientClosedRequest)
		return
	}
	writeAPIError(w, aerr)
}

// apiErrorFor maps a Submit error to its answer; nil means the client is
// gone and nothing is to be written.
func (h *httpHandler) apiErrorFor(r *http.Request, err error) *apiError {
	if r.Context().Err() != nil {
		return nil
	}
	aerr := errorFor(err)
	if aerr != nil && aerr.status >= 500 && aerr.Code == codeInternal {
		h.log.Warn("chat completion failed", "err", err)
	}
	return aerr
}

func (h *httpHandler) listModels(w http.ResponseWriter, r *http.Request) {
	pools := h.d.Pools()
	slices.Sort(pools)
	list := modelList{Object: "list", Data: make([]model, 0, len(pools))}
	for _, p := range pools {
		list.Data = append(list.Data, newModel(p))
	}
	writeJSON(w, http.StatusOK, list)
}

func (h *httpHandler) getModel(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("model")
	if !slices.Contains(h.d.Pools(), name) {
		writeAPIError(w, modelNotFound())
		return
	}
	writeJSON(w, http.StatusOK, newModel(name))
}

func (h *httpHandler) healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (h *httpHandler) readyz(w http.ResponseWriter, r *http.Request) {
	rep := h.ready.check()
	status := http.StatusOK
	if !rep.Ready {
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, status, rep)
}

// setHedgeHeaders writes how the answer was won.
func setHedgeHeaders(h http.Header, resp *Response) {
	h.Set(HeaderAttempts, strconv.Itoa(resp.Attempts))
	h.Set(HeaderHedged, strconv.FormatBool(resp.Hedged))
	h.Set(HeaderWinnerRoute, resp.WinnerRoute)
	h.Set(HeaderGate, resp.Gate)
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

// completionID names a completion after its hedge group, so a caller's
// report can be matched to the records; a stream that starts before its
// group is known gets a random one.
func completionID(groupID string) string {
	if groupID != "" {
		return "chatcmpl-" + groupID
	}
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return "chatcmpl-" + hex.EncodeToString(b[:])
}
