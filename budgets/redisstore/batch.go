package redisstore

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// batch is one round trip: script calls and plain commands pipelined
// together. A ClusterClient splits it by node and sends the parts at once.
type batch struct {
	client redis.UniversalClient
	pipe   redis.Pipeliner
	calls  []*scriptCall
}

// scriptCall is one script invocation of a batch; cmd holds its reply
// once the batch ran.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd
}

// reply is a queued command's answer, read once its batch ran: a
// scriptCall or a go-redis command.
type reply interface{ Err() error }

// Err is the error of the call's reply once the batch ran: the EVAL
// retry's when the server did not know the script.
func (c *scriptCall) Err() error { return c.cmd.Err() }

func newBatch(client redis.UniversalClient) *batch {
	return &batch{client: client, pipe: client.Pipeline()}
}

// eval queues script by its SHA-1 (EVALSHA).
func (b *batch) eval(ctx context.Context, script *redis.Script, keys []string, args ...any) *scriptCall {
	c := &scriptCall{script: script, keys: keys, args: args}
	c.cmd = script.EvalSha(ctx, b.pipe, keys, args...)
	b.calls = append(b.calls, c)
	return c
}

// exec sends the batch and reports whether Redis answered every command,
// with a value or an error reply; false means some command got no answer
// (unreachable, too slow, a broken connection). A server that does not
// know a script yet (its first use there, or a restarted server) refuses
// it with NOSCRIPT without running it; those calls alone are sent again
// with their source (EVAL, which also caches it), in a second batch that
// only happens then. Errors are read per command.
func (b *batch) exec(ctx context.Context) (answered bool) {
	if b.pipe.Len() == 0 {
		return true
	}
	cmds, _ := b.pipe.Exec(ctx)
	answered = allAnswered(cmds)
	var missing []*scriptCall
	for _, c := range b.calls {
		if redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			missing = append(missing, c)
		}
	}
	if len(missing) == 0 {
		return answered
	}
	retry := b.client.Pipeline()
	for _, c := range missing {
		c.cmd = c.script.Eval(ctx, retry, c.keys, c.args...)
	}
	cmds, _ = retry.Exec(ctx)
	return answered && allAnswered(cmds)
}

// allAnswered reports whether every command got a reply from Redis.
func allAnswered(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if err := c.Err(); err != nil && !isReply(err) {
			return false
		}
	}
	return true
}

// isReply reports whether err is an error reply of Redis (which answered)
// rather than a failure to get one.
func isReply(err error) bool {
	var reply redis.Error
	return errors.As(err, &reply)
}
