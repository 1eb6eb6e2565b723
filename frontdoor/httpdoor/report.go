package httpdoor

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/report"
	"github.com/hedgerow/hedgerow/schemas"
)

// ReportPath and RecordsPath are the door's report endpoints
// (docs/architecture.md §9): the report computed from the kept records,
// and the records themselves as JSONL. Both take ?since=DURATION (e.g.
// 10m), the age of the oldest group to include; without it, every kept
// record.
const (
	ReportPath  = "/v1/hedgerow/report"
	RecordsPath = "/v1/hedgerow/records"
)

// RecordSource reads the kept records from since on (zero: all). It is
// what the report endpoints need of the records stream; internal/adapters/records'
// Reader is the one the gateway passes. An error wrapping
// report.ErrNotKept answers 503: the deployment keeps no records.
type RecordSource interface {
	Records(ctx context.Context, since time.Time) (*report.Records, error)
}

// maxSince bounds ?since: the stream keeps a week by default.
const maxSince = 366 * 24 * time.Hour

// reportRoutes adds the report endpoints when the door has a RecordSource.
func (h *handler) reportRoutes() {
	if h.opts.Records == nil {
		return
	}
	h.mux.HandleFunc(ReportPath, h.only(http.MethodGet, openAIDialect{}, h.serveReport(false)))
	h.mux.HandleFunc(RecordsPath, h.only(http.MethodGet, openAIDialect{}, h.serveReport(true)))
}

// serveReport answers the report, or the records as JSONL when raw. The
// caller's tenant must be one of Options.ReportTenants (403 otherwise; 401
// without a valid key), unless the door asks for no key at all.
func (h *handler) serveReport(raw bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		dl := openAIDialect{}
		tenant, f := h.authenticate(r)
		if f != nil {
			dl.writeFailure(w, f)
			return
		}
		if h.opts.Keyring != nil && !h.opts.ReportTenants[tenant] {
			dl.writeFailure(w, &frontdoor.Failure{Code: frontdoor.CodePermissionDenied,
				Message: "This API key's tenant may not read reports (the tenant's reports setting)."})
			return
		}
		var since time.Time
		if v := r.URL.Query().Get("since"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 || d > maxSince {
				dl.writeFailure(w, frontdoor.InvalidParam("since", "since must be a positive duration of at most 8784h, e.g. 10m."))
				return
			}
			since = h.now().Add(-d)
		}
		recs, err := h.opts.Records.Records(r.Context(), since)
		if err != nil {
			if errors.Is(err, report.ErrTooMany) {
				dl.writeFailure(w, frontdoor.InvalidParam("since",
					"There are more records in this span than one report request may read; ask for a shorter since, "+
						"or read the stream itself with `hedgerow report --nats`."))
				return
			}
			if errors.Is(err, report.ErrNotKept) {
				dl.writeFailure(w, &frontdoor.Failure{Code: string(schemas.ErrUnavailable),
					Message: "Records are not kept by this deployment (NATS without JetStream), so there is nothing to report."})
				return
			}
			h.log.Warn("report: reading the records failed", "err", err)
			dl.writeFailure(w, &frontdoor.Failure{Code: frontdoor.CodeInternal, Message: "The records could not be read."})
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		if raw {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			if err := recs.WriteJSONL(w); err != nil {
				h.log.Debug("report: writing the records", slog.String("err", err.Error()))
			}
			return
		}
		writeJSON(w, http.StatusOK, report.Compute(recs, report.Options{}))
	}
}
