package client_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/client"
	"github.com/hedgerow/hedgerow/internal/natsauth"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
)

// startExampleGateway runs `hedgerow serve` in front of one instant fake
// route for the examples and returns its NATS address and the seed file of
// the client user `hedgerow nats-auth` generated for it.
func startExampleGateway() (string, string, func()) {
	model, err := fakellm.InstantModel(20)
	if err != nil {
		log.Fatal(err)
	}
	h, err := startHedgerow(1, model)
	if err != nil {
		log.Fatal(err)
	}
	return h.NATSURL(), h.users.SeedFile(natsauth.UserClient), func() {
		if err := h.Stop(); err != nil {
			log.Print(err)
		}
	}
}

// A Go service submits one user action over NATS request-reply and gets the
// committed answer, or one stable error code.
func Example() {
	natsURL, seedFile, stop := startExampleGateway()
	defer stop()

	// The client user may only request hedgerow.submit and read inboxes
	// under its own prefix (docs/architecture.md §13).
	auth, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(natsURL, auth, nats.CustomInboxPrefix(schemas.ClientInbox(natsauth.UserClient)))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	resp, err := c.Submit(ctx, client.Request{
		ModelClass:     "general",
		IdempotencyKey: "order-2291-summary",
		Request: schemas.ChatRequest{
			Messages:  []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent("Say hello")}},
			MaxTokens: 5,
		},
	})
	var herr *client.Error
	switch {
	case errors.As(err, &herr):
		fmt.Println("failed:", herr.Code, herr.Message)
	case err != nil:
		fmt.Println("no answer:", err)
	default:
		fmt.Println(resp.FinishReason, resp.Usage.OutputUnits, "tokens, won by", resp.WinnerRoute)
	}
	// Output: length 5 tokens, won by fake-a
}

// A stream hands over the committed answer as it is produced.
func ExampleClient_Stream() {
	natsURL, seedFile, stop := startExampleGateway()
	defer stop()

	// The client user may only request hedgerow.submit and read inboxes
	// under its own prefix (docs/architecture.md §13).
	auth, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(natsURL, auth, nats.CustomInboxPrefix(schemas.ClientInbox(natsauth.UserClient)))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	s, err := c.Stream(ctx, client.Request{
		ModelClass: "general",
		Request: schemas.ChatRequest{
			Messages:  []schemas.Message{{Role: schemas.MessageUser, Content: schemas.TextContent("Count to three")}},
			MaxTokens: 3,
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close() // cancels the request if the stream is abandoned
	text := ""
	for s.Next() {
		text += s.Chunk().Delta
	}
	if err := s.Err(); err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(text) > 0, s.Response().FinishReason)
	// Output: true length
}
