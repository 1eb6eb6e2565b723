package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// The X-Hedgerow-* response headers (frontdoor.Header*); repeated here so
// the load generator depends on the wire, not on the gateway's code.
const (
	headerAttempts    = "X-Hedgerow-Attempts"
	headerHedged      = "X-Hedgerow-Hedged"
	headerWinnerRoute = "X-Hedgerow-Winner-Route"
	headerGate        = "X-Hedgerow-Gate"
)

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 64 << 10

// ErrIncomplete means a response ended without its terminator: a stream
// without "data: [DONE]" (e.g. cut off after its commit) or an empty body.
var ErrIncomplete = errors.New("response ended before it was complete")

// StatusError is a response with a status other than 200, with the OpenAI
// error object's code and message when the body carried one.
type StatusError struct {
	Status  int
	Code    string
	Message string
}

func (e *StatusError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("HTTP %d", e.Status)
	}
	return fmt.Sprintf("HTTP %d (%s): %s", e.Status, e.Code, e.Message)
}

// StreamError is an error event inside a stream whose status was 200: the
// server failed after its answer had started.
type StreamError struct {
	Code    string
	Message string
}

func (e *StreamError) Error() string {
	return fmt.Sprintf("error event in stream (%s): %s", e.Code, e.Message)
}

// errorBody is the OpenAI error object, as bodies and error events carry it.
type errorBody struct {
	Error *struct {
		Message string  `json:"message"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// send sends request i, due at offset due, to its target and reads its
// answer to the end.
func (g *generator) send(ctx context.Context, i int, due time.Duration) (res Result) {
	rq := g.cfg.Requests[i]
	res = Result{Index: i, Target: rq.Target, Due: due, Sent: g.now().Sub(g.start)}
	since := func() time.Duration { return g.now().Sub(g.start) - due }
	defer func() { res.Total = since() }()
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	g.targets[rq.Target].Send(ctx, rq, since, &res)
	return res
}

// Send posts the request and reads its answer: a stream as server-sent
// events, anything else as one chat completion.
func (t *httpTarget) Send(ctx context.Context, rq Request, since func() time.Duration, res *Result) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.url, bytes.NewReader(rq.Body))
	if err != nil {
		res.Err = fmt.Errorf("build request: %w", err)
		return
	}
	for k, vs := range rq.Header {
		req.Header[k] = append([]string(nil), vs...)
	}
	req.Header.Set("Content-Type", "application/json")
	if t.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+t.apiKey)
	}
	resp, err := t.client.Do(req)
	if err != nil {
		res.Err = fmt.Errorf("send: %w", err)
		return
	}
	defer func() { _ = resp.Body.Close() }()
	res.Status = resp.StatusCode
	res.Hedge = hedgeOf(resp.Header, false)

	if resp.StatusCode != http.StatusOK {
		res.Err = statusError(resp)
		return
	}
	mediaType, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mediaType == "text/event-stream" {
		st, err := readStream(resp.Body, since)
		res.FirstToken, res.Chunks, res.Err = st.firstToken, st.chunks, err
	} else {
		res.FirstToken, res.Chunks, res.Err = readCompletion(resp.Body, since)
	}
	// Trailers are known only once the body has been read to its end,
	// which [DONE] is not quite.
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody)); err != nil && res.Err == nil {
		res.Err = fmt.Errorf("read to the end of the response: %w", err)
	}
	if h := hedgeOf(resp.Trailer, true); h.Gate != "" || h.WinnerRoute != "" {
		res.Hedge = h
	}
}

// hedgeOf reads the X-Hedgerow-* values of a header or trailer set.
func hedgeOf(h http.Header, trailers bool) Hedge {
	out := Hedge{WinnerRoute: h.Get(headerWinnerRoute), Gate: h.Get(headerGate), FromTrailers: trailers}
	out.Attempts, _ = strconv.Atoi(h.Get(headerAttempts))
	out.Hedged, _ = strconv.ParseBool(h.Get(headerHedged))
	return out
}

// statusError reads the error object of a non-200 response.
func statusError(resp *http.Response) error {
	e := &StatusError{Status: resp.StatusCode}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if err != nil {
		return fmt.Errorf("%w; reading its body: %w", e, err)
	}
	var body errorBody
	if json.Unmarshal(data, &body) == nil && body.Error != nil {
		e.Message = body.Error.Message
		if body.Error.Code != nil {
			e.Code = *body.Error.Code
		}
	}
	return e
}

// readCompletion reads a non-streaming answer: its first token arrives with
// the whole body.
func readCompletion(body io.Reader, since func() time.Duration) (time.Duration, int, error) {
	var c struct {
		Choices []struct {
			Message struct {
				Content   string          `json:"content"`
				ToolCalls json.RawMessage `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(body).Decode(&c); err != nil {
		return 0, 0, fmt.Errorf("read completion: %w", err)
	}
	at := since()
	for _, ch := range c.Choices {
		if ch.Message.Content != "" || schemas.HasToolCalls(ch.Message.ToolCalls) {
			return at, 1, nil
		}
	}
	return 0, 0, ErrIncomplete
}
