package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// httpPost posts a JSON body and returns the status and the body of the answer.
func httpPost(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// metric returns the value of the sample whose line starts with series.
func metric(t *testing.T, s *server, series string) string {
	t.Helper()
	_, body := httpGet(t, "http://"+s.httpAddr+"/metrics")
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, series+" ") {
			return strings.TrimPrefix(line, series+" ")
		}
	}
	return ""
}

func TestMetricsMove(t *testing.T) {
	t.Parallel()
	s := startServer(t, startRedis(t), testConfig)
	for i := 0; i < 6; i++ {
		s.ask(t, request("e2e", descriptor("log", "m")))
	}
	s.ask(t, request("e2e", descriptor("shadow", "m")))
	s.ask(t, request("e2e", descriptor("shadow", "m")))
	if _, err := s.rls.ShouldRateLimit(t.Context(), request("")); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a request without a domain: %v, want InvalidArgument", err)
	}
	want := map[string]string{
		`ratelimit_decisions_total{domain="e2e",outcome="within_limit",rule="log"}`:         "3",
		`ratelimit_decisions_total{domain="e2e",outcome="near_limit",rule="log"}`:           "2",
		`ratelimit_decisions_total{domain="e2e",outcome="over_limit",rule="log"}`:           "1",
		`ratelimit_decisions_total{domain="e2e",outcome="shadow_would_deny",rule="shadow"}`: "1",
		`ratelimit_invalid_requests_total{reason="empty_domain"}`:                           "1",
		`ratelimit_store_call_duration_seconds_count`:                                       "8",
		`ratelimit_config_generation`:                                                       "1",
	}
	for series, v := range want {
		if got := metric(t, s, series); got != v {
			t.Errorf("%s = %q, want %q", series, got, v)
		}
	}
}

// rlconfig reads GET /rlconfig.
func rlconfig(t *testing.T, s *server) (view struct {
	Generation      uint64 `json:"generation"`
	LastReloadError *struct {
		Error string `json:"error"`
	} `json:"last_reload_error"`
	Rules []struct {
		Rule            string `json:"rule"`
		Source          string `json:"source"`
		RequestsPerUnit uint32 `json:"requests_per_unit"`
	} `json:"rules"`
}) {
	t.Helper()
	code, body := httpGet(t, "http://"+s.httpAddr+"/rlconfig")
	if code != http.StatusOK {
		t.Fatalf("/rlconfig: %d %s", code, body)
	}
	if err := json.Unmarshal([]byte(body), &view); err != nil {
		t.Fatalf("/rlconfig: %v\n%s", err, body)
	}
	return view
}

func TestHotReloadKeepsCounters(t *testing.T) {
	t.Parallel()
	const rules = "domain: e2e\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: %d, algorithm: sliding_window_log}\n"
	s := startServer(t, startRedis(t), fmt.Sprintf(rules, 5))
	file := filepath.Join(s.configDir, "config.yaml")
	for i := 0; i < 3; i++ {
		s.ask(t, request("e2e", descriptor("user", "u")))
	}

	// A bad write is refused: the old config keeps serving, the error is shown and counted.
	writeFile(t, file, "domain: e2e\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1.5}\n")
	waitFor(t, 5*time.Second, func() error {
		if v := rlconfig(t, s); v.LastReloadError == nil {
			return errNotYet
		}
		return nil
	})
	if v := rlconfig(t, s); v.Generation != 1 || !strings.Contains(v.LastReloadError.Error, "config.yaml:4") {
		t.Fatalf("after a bad write: generation %d, error %+v", v.Generation, v.LastReloadError)
	}
	if got := metric(t, s, `ratelimit_config_reloads_total{outcome="failure"}`); got != "1" {
		t.Fatalf("failed reloads %q, want 1", got)
	}
	if st := s.ask(t, request("e2e", descriptor("user", "u"))).Statuses[0]; st.LimitRemaining != 1 {
		t.Fatalf("the old config stopped serving: %v", st)
	}

	// The next good write is taken; the window's history carries over.
	writeFile(t, file, fmt.Sprintf(rules, 6))
	waitFor(t, 5*time.Second, func() error {
		if v := rlconfig(t, s); v.Generation != 2 {
			return errNotYet
		}
		return nil
	})
	v := rlconfig(t, s)
	if v.LastReloadError != nil || len(v.Rules) != 1 || v.Rules[0].RequestsPerUnit != 6 || !strings.HasSuffix(v.Rules[0].Source, "config.yaml:3") {
		t.Fatalf("after a good write: %+v", v)
	}
	st := s.ask(t, request("e2e", descriptor("user", "u"))).Statuses[0]
	if st.CurrentLimit.GetRequestsPerUnit() != 6 || st.LimitRemaining != 1 {
		t.Fatalf("after raising the limit to 6 with 5 used: %v, want 1 left", st)
	}
}

func TestJSONEndpoint(t *testing.T) {
	t.Parallel()
	s := startServer(t, startRedis(t), testConfig)
	post := func(body string) (int, http.Header, string) {
		resp, err := http.Post("http://"+s.httpAddr+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	// fixed admits 5 in a fixed window of a minute: six posts in one.
	type answer struct {
		code   int
		header http.Header
		body   string
	}
	answers := inOneWindow(t, time.Minute, func(attempt int) []answer {
		req := `{"domain":"e2e","descriptors":[{"entries":[{"key":"fixed","value":"` + attemptValue("j", attempt) + `"}]}]}`
		var answers []answer
		for range 6 {
			code, header, body := post(req)
			answers = append(answers, answer{code, header, body})
		}
		return answers
	})
	for i, a := range answers[:5] {
		if a.code != http.StatusOK || !strings.Contains(a.body, `"overallCode":"OK"`) {
			t.Fatalf("request %d: %d %s", i, a.code, a.body)
		}
	}
	if a := answers[5]; a.code != http.StatusTooManyRequests || a.header.Get("Retry-After") == "" || !strings.Contains(a.body, "OVER_LIMIT") {
		t.Fatalf("over the limit: %d %v %s", a.code, a.header, a.body)
	}
	if code, _, body := post(`{"domain":""}`); code != http.StatusBadRequest || !strings.Contains(body, "domain is empty") {
		t.Fatalf("bad request: %d %s", code, body)
	}
	if code, _, _ := post(`{not json`); code != http.StatusBadRequest {
		t.Fatalf("malformed JSON: %d", code)
	}
}

// TestGlobalShadowMode: --shadow-mode admits every request, and, as the
// reference's SHADOW_MODE, the statuses still say which are over their
// limit; an admitted request has no retry-after.
func TestGlobalShadowMode(t *testing.T) {
	t.Parallel()
	s := startServer(t, startRedis(t), testConfig, "--shadow-mode")
	if edge := nextEdge(time.Minute); time.Until(edge) < 10*time.Second { // the 8 hits in one window
		waitUntil(edge)
	}
	for i := 0; i < 8; i++ {
		want := ok
		if i >= 5 { // fixed admits 5 a minute
			want = over
		}
		resp := s.ask(t, request("e2e", descriptor("fixed", "s")))
		if _, retry := headerValue(resp, "retry-after"); resp.OverallCode != ok || resp.Statuses[0].Code != want || retry {
			t.Fatalf("hit %d under global shadow mode: %v, want overall OK, status %v, no retry-after", i, resp, want)
		}
	}
	if got := metric(t, s, `ratelimit_decisions_total{domain="e2e",outcome="shadow_would_deny",rule="fixed"}`); got != "3" {
		t.Fatalf("would-deny count %q, want 3", got)
	}
}
