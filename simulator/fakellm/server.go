package fakellm

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hedgerow/hedgerow/simulator/workload"
)

// Defaults of the optional Options fields.
const (
	DefaultStatsCapacity = 100_000
	DefaultMaxBodyBytes  = 4 << 20
	// DefaultStatsLimit caps the records one /stats answer carries unless
	// the poller asks for another ?limit=; it keeps a poll of a full ring
	// from building a hundred-megabyte body.
	DefaultStatsLimit = 10_000
)

// ErrInvalidOptions is returned by New for its Options it cannot run.
var ErrInvalidOptions = errors.New("fakellm: invalid options")

// Options describes the route a Server plays.
type Options struct {
	// Workload names a built-in model (workload.Names). Ignored when Model
	// is set.
	Workload string
	// Model, when set, is the explicit model to run instead of a built-in
	// one, e.g. a built-in with one parameter changed. It is copied.
	Model *workload.Model
	// Seed seeds the workload; every route of a run must share it so a
	// request has the same output length on each.
	Seed uint64
	// TimeScale is real seconds per model second (0.02: the model runs 50×
	// faster than real time). 0 means real time.
	TimeScale float64
	// Route is which route of the model this server plays: it keys the
	// latency draws and, for the degraded model, the episode schedule (0..2).
	// Two servers of a run must play different routes to be independent.
	Route int
	// RateLimit is the route's RPM/TPM bucket, in model time; zero is none.
	RateLimit workload.RateLimit
	// Now is the clock; nil means time.Now. Waits use real timers for the
	// remaining real time Now reports, so an injected clock shifts when
	// things happen relative to it but cannot stop them.
	Now func() time.Time
	// ModelID is the model /v1/models lists and responses name when a
	// request names none; empty means the workload's name. Requests may
	// name any model: the route, not the name, decides the behaviour.
	ModelID string
	// HangCap is how long, in model time, a hung attempt holds its
	// connection before it is answered 504; 0 means the pinned deadline.
	HangCap time.Duration
	// StatsCapacity is how many finished requests /stats retains; 0 means
	// DefaultStatsCapacity.
	StatsCapacity int
	// MaxBodyBytes caps a request body; 0 means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// OnRecord, when set, is called with each finished request's record
	// after /stats holds it, on the request's goroutine. In-process
	// observers use it instead of polling; it must not block.
	OnRecord func(Record)
	// OnStart, when set, is called as a chat request reaches the provider
	// (its attempt is drawn and it will end in a record), on the request's
	// goroutine; it must not block.
	OnStart func()
	// OpenEarly opens a stream as real providers do, long before the model
	// produces anything: the headers and the opening events (the empty role
	// chunk; message_start, the text block's start and a ping) go out as
	// the request arrives, and the first token follows at the drawn first
	// byte. A hung attempt's stream opens too and then stays silent until
	// the hang cap ends it with an error event. Without it the headers and
	// the opening wait for the first token. Non-streaming answers, errors
	// and rate limits are the same either way.
	OpenEarly bool
	// Continuation is how the route continues an answer from partial
	// assistant output (continuation.go); empty means ContinuationNone.
	// Whatever the style, an answer's text is a function of the
	// conversation alone and its length of the conversation and its cap:
	// the same on every route and seed.
	Continuation Continuation
	// BreakShare is the share of streaming answers the route breaks after
	// BreakAfter content tokens, the way BreakMode says (empty: BreakCut).
	// Which answers break is drawn per request (StreamBreaks); answers of
	// BreakAfter tokens or fewer and continuations never break. A mode
	// ends the stream after those tokens by a cut connection, an in-band
	// error event, a stall, one malformed event, or a normal end at the
	// length limit (truncate).
	BreakShare float64
	BreakAfter int
	BreakMode  BreakMode
	// BreakStallFor, with BreakMode BreakStall, is how long (model time,
	// like every time of the fake) a stalled stream stays silent before it
	// resumes and completes as it would have: the rest of the same text,
	// its tokens at the model's pace from the resumption on. 0 stalls until
	// the client leaves; a positive value with another mode is refused.
	BreakStallFor time.Duration
}

// Server is an OpenAI-compatible chat completions server playing one route
// of a workload model. It serves POST /v1/chat/completions, POST
// /v1/messages (Anthropic's Messages API), POST /v1/responses (OpenAI's
// Responses API), POST /v1/embeddings, GET /v1/models, GET /stats and
// GET /healthz. It is safe for concurrent use and owns no
// goroutines; Close ends the requests it is holding.
type Server struct {
	gen      *workload.Generator
	provider *workload.Provider
	scale    workload.TimeScale
	route    int
	workload string
	modelID  string
	hangCap  time.Duration
	maxBody  int64
	now      func() time.Time
	onRecord func(Record)
	onStart  func()
	early    bool // Options.OpenEarly
	// text draws answers' lengths and input tokens from the fixed
	// textSeed, so they are the same on every route and seed.
	text       *workload.Generator
	style      Continuation
	breakShare float64
	breakAfter int
	breakMode  BreakMode
	// breakStallFor is Options.BreakStallFor.
	breakStallFor time.Duration

	began    time.Time    // model time 0
	attempts atomic.Int64 // the attempt counter; numbers start at 1
	stats    *statsBook
	closed   chan struct{} // closed by Close
	close    sync.Once
}

// New returns a server for cfg.
func New(cfg Options) (*Server, error) {
	model := cfg.Model
	if model == nil {
		m, err := workload.ByName(cfg.Workload)
		if err != nil {
			return nil, fmt.Errorf("fake LLM: %w", err)
		}
		model = m
	}
	gen, err := workload.NewGenerator(model, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("fake LLM: %w", err)
	}
	provider, err := gen.Provider(cfg.Route, cfg.RateLimit)
	if err != nil {
		return nil, fmt.Errorf("fake LLM: %w", err)
	}
	var scale workload.TimeScale
	if cfg.TimeScale != 0 {
		if scale, err = workload.NewTimeScale(cfg.TimeScale); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
		}
	}
	switch {
	case cfg.HangCap < 0:
		return nil, fmt.Errorf("%w: hang cap %v is negative", ErrInvalidOptions, cfg.HangCap)
	case cfg.StatsCapacity < 0:
		return nil, fmt.Errorf("%w: stats capacity %d is negative", ErrInvalidOptions, cfg.StatsCapacity)
	case cfg.MaxBodyBytes < 0:
		return nil, fmt.Errorf("%w: max body bytes %d is negative", ErrInvalidOptions, cfg.MaxBodyBytes)
	}
	style, err := ParseContinuation(string(cfg.Continuation))
	if err != nil {
		return nil, err
	}
	if err := checkBreaks(cfg); err != nil {
		return nil, err
	}
	text, err := workload.NewGenerator(model, textSeed)
	if err != nil {
		return nil, fmt.Errorf("fake LLM: %w", err)
	}
	s := &Server{
		gen:           gen,
		provider:      provider,
		scale:         scale,
		route:         cfg.Route,
		workload:      gen.Model().Name,
		modelID:       cmp.Or(cfg.ModelID, gen.Model().Name),
		hangCap:       cmp.Or(cfg.HangCap, workload.PinnedDeadline),
		maxBody:       cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes),
		now:           cfg.Now,
		onRecord:      cfg.OnRecord,
		onStart:       cfg.OnStart,
		early:         cfg.OpenEarly,
		text:          text,
		style:         style,
		breakShare:    cfg.BreakShare,
		breakAfter:    cfg.BreakAfter,
		breakMode:     cmp.Or(cfg.BreakMode, BreakCut),
		breakStallFor: cfg.BreakStallFor,
		stats:         newStatsBook(cmp.Or(cfg.StatsCapacity, DefaultStatsCapacity)),
		closed:        make(chan struct{}),
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.began = s.now()
	return s, nil
}

// Close ends every request the server is holding: waits are cut short,
// requests that have sent nothing are answered 503, streams stop where
// they are. Call it before http.Server.Shutdown, which would otherwise wait
// for hung attempts to reach the hang cap. Requests that arrive after Close
// are answered 503 at once. Close is idempotent.
func (s *Server) Close() {
	s.close.Do(func() { close(s.closed) })
}

// Stats returns the totals and up to limit (0: all) retained records newer
// than since; the same as GET /stats?since=&limit= for in-process callers.
func (s *Server) Stats(since uint64, limit int) (Stats, error) {
	st, err := s.stats.snapshot(since, limit)
	if err != nil {
		return Stats{}, fmt.Errorf("fake LLM stats: %w", err)
	}
	st.Model, st.Workload, st.Route, st.Seed, st.TimeScale = s.modelID, s.workload, s.route, s.gen.Seed(), s.scale.Factor()
	return st, nil
}

// endpoints are the paths the server answers: the OpenAI and Anthropic
// endpoints and the fake's own, each with its one method.
var endpoints = map[string]struct {
	method  string
	handler func(*Server, http.ResponseWriter, *http.Request)
}{
	"/v1/chat/completions": {http.MethodPost, (*Server).handleChat},
	"/v1/messages":         {http.MethodPost, (*Server).handleMessages},
	"/v1/responses":        {http.MethodPost, (*Server).handleResponses},
	"/v1/embeddings":       {http.MethodPost, (*Server).handleEmbeddings},
	"/v1/models":           {http.MethodGet, (*Server).handleModels},
	"/stats":               {http.MethodGet, (*Server).handleStats},
	"/healthz":             {http.MethodGet, (*Server).handleHealth},
}

// ServeHTTP routes the endpoints.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ep, ok := endpoints[r.URL.Path]
	if !ok {
		writeError(w, http.StatusNotFound, errTypeInvalidRequest, errCodeUnknownURL, "",
			fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path))
		return
	}
	if r.Method != ep.method {
		var d dialect = chatCompletions{}
		if r.URL.Path == "/v1/messages" {
			d = messagesAPI{}
		}
		w.Header().Set("Allow", ep.method)
		d.writeError(w, http.StatusMethodNotAllowed, errTypeInvalidRequest, errCodeMethod, "",
			fmt.Sprintf("Method %s is not allowed on %s; use %s", r.Method, r.URL.Path, ep.method))
		return
	}
	ep.handler(s, w, r)
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, modelList{
		Object: "list",
		Data:   []modelObject{{ID: s.modelID, Object: "model", Created: s.began.Unix(), OwnedBy: "hedgerow-fakellm"}},
	})
}

func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	select {
	case <-s.closed:
		writeError(w, http.StatusServiceUnavailable, errTypeServer, errCodeShuttingDown, "", "The server is shutting down.")
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}
}

// handleStats answers GET /stats?since=<seq>&limit=<n>.
func (s *Server) handleStats(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	since, err := queryUint(q.Get("since"), 0)
	if err != nil {
		writeError(w, http.StatusBadRequest, errTypeInvalidRequest, errCodeInvalidParams, "since", err.Error())
		return
	}
	limit, err := queryUint(q.Get("limit"), DefaultStatsLimit)
	if err != nil || limit > math.MaxInt32 {
		writeError(w, http.StatusBadRequest, errTypeInvalidRequest, errCodeInvalidParams, "limit",
			fmt.Sprintf("limit %q must be an integer in [0, %d] (0: no limit)", q.Get("limit"), math.MaxInt32))
		return
	}
	st, err := s.Stats(since, int(limit))
	if err != nil {
		writeError(w, http.StatusBadRequest, errTypeInvalidRequest, errCodeInvalidParams, "since", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func queryUint(v string, def uint64) (uint64, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a non-negative integer", v)
	}
	return n, nil
}

// modelSince returns the model time of real instant t since the server began.
func (s *Server) modelSince(t time.Time) time.Duration {
	return max(s.scale.Model(t.Sub(s.began)), 0)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Every value written is built by this package from plain fields;
		// failing to marshal one is a bug, answered as the API would.
		status = http.StatusInternalServerError
		body = []byte(`{"error":{"message":"internal error encoding the response","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n')) // a failed write means the client left; nothing to tell it
}

// writeError answers with the OpenAI error envelope; empty code or param are
// written as null.
func writeError(w http.ResponseWriter, status int, typ, code, param, message string) {
	obj := errorObject{Message: message, Type: typ}
	if code != "" {
		obj.Code = &code
	}
	if param != "" {
		obj.Param = &param
	}
	writeJSON(w, status, errorBody{Error: obj})
}
