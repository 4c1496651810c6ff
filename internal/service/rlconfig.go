package service

import (
	"fmt"
	"net/http"
	"strings"
)

// ConfigTextHandler serves the config in force as envoyproxy/ratelimit's
// debug port prints it at /rlconfig (what egctl shows): one line per rule,
//
//	<stat key>: unit=<UNIT> requests_per_unit=<N>, shadow_mode: <bool>, quota_mode: <bool>
//
// with the rule's name in the reference's metrics (config.Rule.StatKey), in
// config order. An unlimited rule shows unit=UNKNOWN requests_per_unit=0,
// as there. This service's own fields (algorithm, unit_multiplier,
// failure_mode, sources) are in the JSON of the HTTP port's /rlconfig.
func (s *Service) ConfigTextHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		var b strings.Builder
		for _, r := range s.current.Load().config.Rules() {
			unit, n := "UNKNOWN", uint32(0)
			if !r.Unlimited {
				unit, n = unitToEnvoy(r.Unit).String(), r.RequestsPerUnit
			}
			fmt.Fprintf(&b, "%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t\n",
				r.StatKey(), unit, n, r.ShadowMode, false)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(b.String())) // a write that fails is a client gone: no one left to tell
	})
}
