package node

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFakeTimingsSayWhenTheAnswerStartedAndWhenTheClientLeft: an answered
// request has its first write and no client gone; one whose client leaves
// before the answer has the moment it left and no first write; a request
// that is not a POST is not timed; each moment lies between arrival and end.
func TestFakeTimingsSayWhenTheAnswerStartedAndWhenTheClientLeft(t *testing.T) {
	route := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// As the fake does: the server watches for the client leaving only
		// once the body has been read.
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.Contains(r.URL.RawQuery, "slow") {
			<-r.Context().Done() // the fake waits for its first token, and the client leaves
			return
		}
		_, _ = io.WriteString(w, "data: token\n\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush through the timed writer: %v", err)
		}
	})
	srv := httptest.NewServer(newFakeTimings(route, 8))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

	if resp, err := client.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader("{}")); err != nil {
		t.Fatal(err)
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/chat/completions?slow", strings.NewReader("{}"))
	if _, err := client.Do(req); err == nil {
		t.Fatal("the slow request was answered")
	}
	if resp, err := client.Get(srv.URL + "/healthz"); err == nil {
		resp.Body.Close()
	}

	var got FakeTimings
	deadline := time.Now().Add(5 * time.Second)
	for len(got.Timings) < 2 && time.Now().Before(deadline) { // the slow one is kept once its handler returns
		time.Sleep(10 * time.Millisecond)
		got = fetchTimings(t, srv.URL, 0)
	}
	tests := []struct {
		name             string
		firstWrite, gone bool
		wantSeq          uint64
		wantPath         string
	}{
		{name: "answered", firstWrite: true, wantSeq: 1, wantPath: "/v1/chat/completions"},
		{name: "client left first", gone: true, wantSeq: 2, wantPath: "/v1/chat/completions"},
	}
	if len(got.Timings) != len(tests) || got.NextSince != 2 {
		t.Fatalf("timings = %+v, want %d POSTs timed, next since 2", got, len(tests))
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tm := got.Timings[i]
			if tm.Seq != tt.wantSeq || tm.Path != tt.wantPath || (tm.FirstWriteUs != 0) != tt.firstWrite || (tm.GoneUs != 0) != tt.gone {
				t.Fatalf("timing %+v: want seq %d, first write %v, client gone %v", tm, tt.wantSeq, tt.firstWrite, tt.gone)
			}
			for _, at := range []int64{tm.FirstWriteUs, tm.GoneUs} {
				if at != 0 && (at < tm.ArrivedUs || at > tm.EndedUs) {
					t.Fatalf("timing %+v: a moment outside arrival..end", tm)
				}
			}
		})
	}
}

// TestFakeTimingsKeepTheLastAndCountWhatTheRingDropped: past its capacity
// the ring keeps the newest timings, counts the ones a reader missed, and
// refuses a since past the last.
func TestFakeTimingsKeepTheLastAndCountWhatTheRingDropped(t *testing.T) {
	ft := newFakeTimings(http.NotFoundHandler(), 3)
	for range 5 {
		ft.keep(FakeTiming{})
	}
	tests := []struct {
		since       uint64
		wantSeqs    []uint64
		wantDropped uint64
	}{
		{since: 0, wantSeqs: []uint64{3, 4, 5}, wantDropped: 2},
		{since: 2, wantSeqs: []uint64{3, 4, 5}},
		{since: 4, wantSeqs: []uint64{5}},
		{since: 5, wantSeqs: nil},
	}
	for _, tt := range tests {
		got, err := ft.since(tt.since)
		if err != nil {
			t.Fatalf("since %d: %v", tt.since, err)
		}
		var seqs []uint64
		for _, tm := range got.Timings {
			seqs = append(seqs, tm.Seq)
		}
		if !slices.Equal(seqs, tt.wantSeqs) || got.Dropped != tt.wantDropped || got.NextSince != 5 {
			t.Errorf("since %d = seqs %v dropped %d next %d, want %v dropped %d next 5", tt.since, seqs, got.Dropped, got.NextSince, tt.wantSeqs, tt.wantDropped)
		}
	}
	if _, err := ft.since(6); err == nil {
		t.Error("since past the last timing was accepted")
	}
}

func fetchTimings(t *testing.T, base string, since uint64) FakeTimings {
	t.Helper()
	status, body := get(t, base+FakeTimingsPath+"?since="+strconv.FormatUint(since, 10))
	if status != http.StatusOK {
		t.Fatalf("GET /timings: %d %s", status, body)
	}
	var out FakeTimings
	if err := json.Unmarshal(body, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
