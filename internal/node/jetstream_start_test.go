package node

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestACreationLeftUnansweredAtStartIsAskedAgainAndAnyOtherErrorIsNot(t *testing.T) {
	tests := []struct {
		name      string
		errs      []error // what each try returns; nil afterwards
		wantTries int
		wantErr   error
	}{
		{"answered at once", nil, 1, nil},
		{"unanswered twice, then created", []error{context.DeadlineExceeded, nats.ErrTimeout}, 3, nil},
		{"no JetStream: returned at once", []error{jetstream.ErrJetStreamNotEnabled}, 1, jetstream.ErrJetStreamNotEnabled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tries := 0
			err := createAtStart(context.Background(), func(try context.Context) error {
				if _, ok := try.Deadline(); !ok {
					t.Error("a try has no bound of its own")
				}
				tries++
				if tries <= len(tt.errs) {
					return tt.errs[tries-1]
				}
				return nil
			})
			if tries != tt.wantTries || !errors.Is(err, tt.wantErr) {
				t.Fatalf("%d tries, error %v; want %d, %v", tries, err, tt.wantTries, tt.wantErr)
			}
		})
	}
	t.Run("past the start bound: the last error", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		tries := 0
		err := createAtStart(ctx, func(context.Context) error {
			tries++
			cancel() // the start bound passes during the first try
			return context.DeadlineExceeded
		})
		if tries != 1 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%d tries, error %v; want one try and its error", tries, err)
		}
	})
}
