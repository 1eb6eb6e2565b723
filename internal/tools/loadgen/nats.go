package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/schemas"
)

// natsTarget is hedgerow's NATS front door, through the Go client.
type natsTarget struct {
	c *client.Client
}

// NewNATSTarget returns the hedgerow.submit front door behind c as a
// Target. Request bodies are SubmitRequests (JSON); a request whose
// request.stream is set is streamed. A failure the gateway answered counts
// with its HTTP-like status and its *client.Error.
func NewNATSTarget(c *client.Client) Target { return &natsTarget{c: c} }

// Send submits the request and reads its answer to the end.
func (t *natsTarget) Send(ctx context.Context, rq Request, since func() time.Duration, res *Result) {
	var req client.Request
	if err := json.Unmarshal(rq.Body, &req); err != nil {
		res.Err = fmt.Errorf("decode submit request: %w", err)
		return
	}
	var (
		resp *client.Response
		err  error
	)
	if req.Request.Stream {
		resp, err = t.stream(ctx, req, since, res)
	} else if resp, err = t.c.Submit(ctx, req); err == nil {
		if resp.Content == "" && !schemas.HasToolCalls(resp.ToolCalls) {
			err = ErrIncomplete
		} else {
			res.FirstToken, res.Chunks = since(), 1
		}
	}
	if herr, ok := errors.AsType[*client.Error](err); ok {
		res.Status = herr.Status
	}
	if resp != nil {
		res.Status = http.StatusOK
		res.Hedge = Hedge{Attempts: resp.Attempts, Hedged: resp.Hedged, WinnerRoute: resp.WinnerRoute}
		if g := resp.Gate; g != nil {
			res.Hedge.Gate = g.GroupID + "/" + strconv.Itoa(g.Attempt) + "/" + strconv.FormatInt(g.Epoch, 10)
		}
	}
	res.Err = err
}

// stream reads a streamed answer: the first content or tool-call chunk is
// its first token.
func (t *natsTarget) stream(ctx context.Context, req client.Request, since func() time.Duration, res *Result) (*schemas.SubmitResponse, error) {
	s, err := t.c.Stream(ctx, req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = s.Close() }()
	for s.Next() {
		ch := s.Chunk()
		if ch.Delta == "" && !schemas.HasToolCalls(ch.ToolCalls) {
			continue
		}
		res.Chunks++
		if res.FirstToken == 0 {
			res.FirstToken = max(since(), 1) // nonzero: zero means none
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if res.Chunks == 0 {
		return s.Response(), ErrIncomplete
	}
	return s.Response(), nil
}
