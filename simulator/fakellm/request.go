package fakellm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// chatParams is a validated chat request: what the draw and the answer need.
type chatParams struct {
	model string
	// requestID keys the attempt's draws and the records: the request as
	// sent. textID keys the answer's text: the conversation alone, before
	// a continuation's partial.
	requestID uint64
	textID    uint64
	// cont is set for a request to continue a partial answer.
	cont *continuation
	// maxTokens is the effective output cap; 0 means none.
	maxTokens    int
	stream       bool
	includeUsage bool
	// embedding is set for an embeddings request (embeddings.go).
	embedding *embeddingParams
}

// requestError is a request the server refuses with 400, naming the
// parameter at fault when there is one.
type requestError struct {
	param, code, message string
}

func (e *requestError) Error() string { return e.message }

// canonicalKey is what identifies a request across routes: the
// conversation and the output cap, which decide the answer, and nothing
// that differs between copies of one request (model name, stream flag,
// sampling parameters). Marshalling it compacts raw content, so the same
// conversation sent with different whitespace gets the same id.
type canonicalKey struct {
	Messages  []schemas.Message `json:"messages"`
	MaxTokens int               `json:"max_tokens"`
}

// parseChat decodes and validates a chat completions body for a route of
// continuation style.
func parseChat(body []byte, maxOutput int, style Continuation) (chatParams, error) {
	var req chatCompletionRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return chatParams{}, &requestError{code: errCodeInvalidBody,
			message: fmt.Sprintf("We could not parse the JSON body of your request: %v", err)}
	}
	if len(req.Messages) == 0 {
		return chatParams{}, &requestError{param: "messages", code: errCodeInvalidParams,
			message: "messages must be a non-empty array of messages."}
	}
	if err := req.ChatRequest.Validate(); err != nil {
		return chatParams{}, &requestError{code: errCodeInvalidParams, message: err.Error()}
	}
	if m := req.MaxCompletionTokens; m != nil && *m < 0 {
		return chatParams{}, &requestError{param: "max_completion_tokens", code: errCodeInvalidParams,
			message: fmt.Sprintf("max_completion_tokens %d is negative.", *m)}
	}
	if n := req.N; n != nil && *n != 1 {
		return chatParams{}, &requestError{param: "n", code: errCodeInvalidParams,
			message: fmt.Sprintf("n is %d; this server produces exactly one choice, so n must be 1.", *n)}
	}
	cont, err := chatContinuation(body, &req, style)
	if err != nil {
		return chatParams{}, err
	}
	limit := req.MaxTokens
	if m := req.MaxCompletionTokens; m != nil && *m > 0 && (limit == 0 || *m < limit) {
		limit = *m
	}
	return newChatParams(req.Model, req.Messages, limit, maxOutput, req.Stream,
		req.Stream && req.StreamOptions != nil && req.StreamOptions.IncludeUsage, cont)
}

// RequestID is the request id the fake derives from a chat request's
// messages and output cap (below the model's longest answer; 0 for none):
// the FNV hash of their canonical key. A load generator that computes it
// for the requests it sends can join the fake's records to them.
func RequestID(msgs []schemas.Message, maxTokens int) (uint64, error) {
	key, err := json.Marshal(canonicalKey{Messages: msgs, MaxTokens: maxTokens})
	if err != nil {
		return 0, fmt.Errorf("fakellm: request key: %w", err)
	}
	return workload.RequestIDFromKey(key), nil
}

// newChatParams identifies a request by its conversation and output cap,
// whichever API it came in. A cap at or above maxOutput, the longest answer
// the model draws, cannot change the answer, so it is no cap: a Messages
// request, which must name one, then draws what the same chat completion
// without a cap draws. A continuation's conversation is msgs without the
// final message, which holds its partial answer.
func newChatParams(model string, msgs []schemas.Message, limit, maxOutput int, stream, includeUsage bool, cont *continuation) (chatParams, error) {
	if limit >= maxOutput {
		limit = 0
	}
	id, err := RequestID(msgs, limit)
	if err != nil {
		return chatParams{}, &requestError{param: "messages", code: errCodeInvalidParams,
			message: fmt.Sprintf("messages could not be encoded: %v", err)}
	}
	conversation := msgs
	if cont != nil {
		conversation = msgs[:len(msgs)-1]
	}
	text, err := textID(conversation)
	if err != nil {
		return chatParams{}, &requestError{param: "messages", code: errCodeInvalidParams,
			message: fmt.Sprintf("messages could not be encoded: %v", err)}
	}
	return chatParams{
		model:        model,
		requestID:    id,
		textID:       text,
		cont:         cont,
		maxTokens:    limit,
		stream:       stream,
		includeUsage: includeUsage,
	}, nil
}

// fillerWords make the deterministic answer text: token k of a request is
// one word, chosen from the request id so every route says the same thing.
var fillerWords = [...]string{
	"the", "hedge", "row", "keeps", "a", "quiet", "watch", "over", "slow",
	"replies", "and", "every", "second", "copy", "waits", "its", "turn",
	"while", "budgets", "hold", "tokens", "arrive", "in", "order", "as",
	"first", "valid", "answer", "wins", "late", "losers", "pay",
}

// fillerToken returns token k (1-based) of a request's answer; tokens after
// the first carry their leading space, as real tokenizers' words do.
func fillerToken(requestID uint64, k int) string {
	w := fillerWords[(requestID+uint64(k))%uint64(len(fillerWords))]
	if k == 1 {
		return w
	}
	return " " + w
}

// chatContent is content as the chat API carries it: a string as is; of a
// non-empty array of typed parts, the text ones (isText) become chat text
// parts and the others are kept as given, for the key alone. Errors name a
// part by noun ("block", "part") and content that is neither by notList,
// each dialect in its own words.
func chatContent(raw json.RawMessage, noun, notList string, isText func(typ string) bool) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		return raw, nil // raw was decoded as JSON: a valid string
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil || len(parts) == 0 {
		return nil, errors.New(notList)
	}
	for i, p := range parts {
		var head struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(p, &head); err != nil || head.Type == "" {
			return nil, fmt.Errorf("%s %d: want an object with a type", noun, i)
		}
		if !isText(head.Type) {
			continue
		}
		if head.Text == nil {
			return nil, fmt.Errorf("%s %d: a text %s needs text", noun, i, noun)
		}
		parts[i] = append(append([]byte(`{"type":"text","text":`), schemas.TextContent(*head.Text)...), '}')
	}
	return json.Marshal(parts)
}
