package service

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// JSONHandler serves POST /json: a RateLimitRequest in protojson, answered
// with the RateLimitResponse in protojson, status 200, or 429 when over the
// limit (with the answer's headers, retry-after among them, as HTTP headers),
// as envoyproxy/ratelimit offers to callers that are not Envoy. A refused
// request is a 400 with the reason; a body over Options.MaxRequestBytes a
// 413; one the store could not decide, or an overloaded instance could not
// ask it in time, for a rule without failure_mode, a 503 (gRPC's UNAVAILABLE
// or RESOURCE_EXHAUSTED): the caller's own failure policy decides. JSON is
// UTF-8: a value of other bytes is a gRPC-only request.
func (s *Service) JSONHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST a RateLimitRequest in JSON", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.opts.MaxRequestBytes)))
		if err != nil {
			code := http.StatusBadRequest // a body cut short, or read past the server's timeout
			if tooLarge := (*http.MaxBytesError)(nil); errors.As(err, &tooLarge) {
				code = http.StatusRequestEntityTooLarge
			}
			http.Error(w, "reading the body: "+err.Error(), code)
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			http.Error(w, "not a RateLimitRequest: "+err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := s.ShouldRateLimit(r.Context(), &req)
		if err != nil {
			code := http.StatusInternalServerError
			switch status.Code(err) {
			case codes.InvalidArgument:
				code = http.StatusBadRequest
			case codes.Unavailable, codes.ResourceExhausted:
				code = http.StatusServiceUnavailable
			}
			http.Error(w, status.Convert(err).Message(), code)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		for _, h := range resp.ResponseHeadersToAdd {
			w.Header().Add(h.Key, h.Value)
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(out) // a write that fails is a client gone: no one left to tell
	})
}

// configView is what GET /rlconfig shows.
type configView struct {
	Generation      uint64     `json:"generation"`
	Hash            string     `json:"hash"`
	LoadedAt        time.Time  `json:"loaded_at"`
	Files           []string   `json:"files"`
	LastReloadError *errorView `json:"last_reload_error"`
	Rules           []ruleView `json:"rules"`
}

type errorView struct {
	Error string    `json:"error"`
	At    time.Time `json:"at"`
}

type ruleView struct {
	Domain          string   `json:"domain"`
	Rule            string   `json:"rule"`
	Name            string   `json:"name,omitempty"`
	Source          string   `json:"source"`
	Unlimited       bool     `json:"unlimited,omitempty"`
	RequestsPerUnit uint32   `json:"requests_per_unit,omitempty"`
	Unit            string   `json:"unit,omitempty"`
	UnitMultiplier  uint32   `json:"unit_multiplier,omitempty"`
	Algorithm       string   `json:"algorithm,omitempty"`
	Burst           uint32   `json:"burst,omitempty"`
	FailureMode     string   `json:"failure_mode,omitempty"`
	RecordCosts     string   `json:"record_costs,omitempty"`
	Leases          bool     `json:"leases,omitempty"`
	LeaseTTL        string   `json:"lease_ttl,omitempty"` // with leases; the window when empty
	ShadowMode      bool     `json:"shadow_mode,omitempty"`
	QuotaMode       bool     `json:"quota_mode,omitempty"`
	Replaces        []string `json:"replaces,omitempty"`
}

// ConfigHandler serves GET /rlconfig: the rules in force with their source
// files and lines, the generation and hash, and the last failed reload if
// the config in force is older than it.
func (s *Service) ConfigHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		snap := s.current.Load()
		view := configView{
			Generation: snap.generation,
			Hash:       snap.config.Hash(),
			LoadedAt:   snap.loadedAt.UTC(),
			Files:      snap.config.Files(),
			Rules:      []ruleView{},
		}
		s.reloadMu.Lock()
		if e := s.lastReloadErr; e != nil {
			view.LastReloadError = &errorView{Error: e.err.Error(), At: e.at.UTC()}
		}
		s.reloadMu.Unlock()
		for _, r := range snap.config.Rules() {
			rv := ruleView{
				Domain: r.Domain, Rule: r.Path(), Name: r.Name, Source: r.Source,
				Unlimited: r.Unlimited, ShadowMode: r.ShadowMode, QuotaMode: r.QuotaMode, Replaces: r.Replaces,
			}
			if !r.Unlimited {
				rv.RequestsPerUnit, rv.Unit, rv.UnitMultiplier = r.RequestsPerUnit, r.Unit.String(), r.UnitMultiplier
				rv.Algorithm, rv.FailureMode, rv.RecordCosts = r.Algorithm.String(), r.FailureMode.String(), r.RecordCosts.String()
				rv.Burst = r.Burst
				rv.Leases = r.Leases
				if r.LeaseTTL > 0 {
					rv.LeaseTTL = r.LeaseTTL.String()
				}
			}
			view.Rules = append(view.Rules, rv)
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		// The view is strings and numbers, which encode; a write that fails
		// is a client gone.
		_ = enc.Encode(view)
	})
}
