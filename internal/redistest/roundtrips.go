package redistest

import (
	"context"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// RoundTrips is a go-redis hook that counts what a client sends: each
// command sent alone and each pipelined batch is one round trip. Add it to
// a client with AddHook.
type RoundTrips struct {
	Commands  atomic.Int64 // commands sent alone
	Pipelines atomic.Int64 // pipelined batches
}

// Total is the number of round trips so far.
func (h *RoundTrips) Total() int64 { return h.Commands.Load() + h.Pipelines.Load() }

// DialHook implements redis.Hook.
func (h *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (h *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.Commands.Add(1)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook.
func (h *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.Pipelines.Add(1)
		return next(ctx, cmds)
	}
}
