package fakellm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
)

// dialect is an API the server speaks: how a request body is read and how
// an exchange's answer, stream and errors are written. The workload draw,
// the timing and the billing of an exchange are the same in every dialect.
type dialect interface {
	// parse decodes and validates a request body. maxOutput is the model's
	// output cap, which no answer exceeds; style is the route's
	// continuation style, which decides what a partial answer means.
	parse(body []byte, maxOutput int, style Continuation) (chatParams, error)
	// id names attempt number of a request on route.
	id(requestID uint64, route, number int) string
	// writeError answers with status. typ, code and param are OpenAI's
	// error type, code and parameter, which other dialects translate.
	writeError(w http.ResponseWriter, status int, typ, code, param, message string)
	// completion is the body of a non-streaming answer.
	completion(ex *exchange, text string) any
	// streamStart, streamToken and streamEnd append a stream's opening
	// events, one token's events and its closing events.
	streamStart(buf *bytes.Buffer, ex *exchange)
	streamToken(buf *bytes.Buffer, ex *exchange, word string)
	streamEnd(buf *bytes.Buffer, ex *exchange)
	// streamError appends the event that ends a stream with an error after
	// its 200; typ and code are OpenAI's, which other dialects translate.
	streamError(buf *bytes.Buffer, typ, code, message string)
}

// chatCompletions is OpenAI's Chat Completions API.
type chatCompletions struct{}

func (chatCompletions) parse(body []byte, maxOutput int, style Continuation) (chatParams, error) {
	return parseChat(body, maxOutput, style)
}

func (chatCompletions) id(requestID uint64, route, number int) string {
	return fmt.Sprintf("chatcmpl-%016x-r%d-a%d", requestID, route, number)
}

func (chatCompletions) writeError(w http.ResponseWriter, status int, typ, code, param, message string) {
	writeError(w, status, typ, code, param, message)
}

func (chatCompletions) completion(ex *exchange, text string) any {
	return chatCompletion{
		ID:                ex.id,
		Object:            "chat.completion",
		Created:           ex.start.Unix(),
		Model:             ex.model,
		SystemFingerprint: systemFingerprint,
		Choices: []choice{{
			Message:      responseMessage{Role: "assistant", Content: text},
			FinishReason: ex.finish,
		}},
		Usage: newUsage(ex.att.Request.InputTokens, ex.att.Request.OutputTokens),
	}
}

// streamStart sends the role chunk.
func (chatCompletions) streamStart(buf *bytes.Buffer, ex *exchange) {
	empty := ""
	appendChunk(buf, ex, []chunkChoice{{Delta: delta{Role: "assistant", Content: &empty}}}, nil)
}

func (chatCompletions) streamToken(buf *bytes.Buffer, ex *exchange, word string) {
	appendChunk(buf, ex, []chunkChoice{{Delta: delta{Content: &word}}}, nil)
}

// streamEnd sends the finish reason, the usage chunk when it was asked
// for, and [DONE].
func (chatCompletions) streamEnd(buf *bytes.Buffer, ex *exchange) {
	appendChunk(buf, ex, []chunkChoice{{FinishReason: &ex.finish}}, nil)
	if ex.p.includeUsage {
		appendChunk(buf, ex, []chunkChoice{}, newUsage(ex.att.Request.InputTokens, ex.att.Request.OutputTokens))
	}
	buf.WriteString("data: [DONE]\n\n")
}

// streamError sends the error object alone as a chunk, as the API does when
// a stream fails after its 200.
func (chatCompletions) streamError(buf *bytes.Buffer, typ, code, message string) {
	appendEvent(buf, "", errorBody{Error: errorObject{Message: message, Type: typ, Code: &code}})
}

// appendChunk appends one server-sent event holding a chunk.
func appendChunk(buf *bytes.Buffer, ex *exchange, choices []chunkChoice, u *usage) {
	c := chatCompletionChunk{
		ID:                ex.id,
		Object:            "chat.completion.chunk",
		Created:           ex.start.Unix(),
		Model:             ex.model,
		SystemFingerprint: systemFingerprint,
		Choices:           choices,
	}
	if ex.p.includeUsage {
		c.Usage = json.RawMessage("null")
		if u != nil {
			raw, err := json.Marshal(u)
			if err != nil {
				raw = json.RawMessage("null") // a struct of ints always marshals
			}
			c.Usage = raw
		}
	}
	appendEvent(buf, "", c)
}
