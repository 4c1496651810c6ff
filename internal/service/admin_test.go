package service

import (
	"context"
	"errors"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/luastore"
	adminv1 "github.com/slidingwindow/ratelimit/proto/ratelimit/admin/v1"
)

const adminTestConfig = `domain: adm
descriptors:
  - key: log
    rate_limit: {name: by_log, unit: minute, requests_per_unit: 5, algorithm: sliding_window_log, failure_mode: deny}
  - key: counter
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: fixed
    rate_limit: {unit: second, unit_multiplier: 60, requests_per_unit: 5, algorithm: fixed_window}
  - key: free
    rate_limit: {unlimited: true}
`

// adminEpoch is a minute boundary: the counters' windows start there.
var adminEpoch = time.Unix(1_700_006_400, 0)

// newAdminTest serves adminTestConfig from a miniredis with a frozen clock,
// through a Service and its Admin on the same limiter.
func newAdminTest(t *testing.T, opts *Options) (*Service, *Admin, *miniredis.Miniredis) {
	t.Helper()
	cfg, err := config.Parse("admin.yaml", []byte(adminTestConfig), config.Defaults{})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := luastore.RunT(t)
	m.SetTime(adminEpoch)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { client.Close() })
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1})
	t.Cleanup(l.Close)
	s := New(cfg, decision.Direct(l), opts)
	return s, NewAdmin(s, directAdmin{l}), m
}

// directAdmin is a limiter as the admin's store, with no slices between.
type directAdmin struct{ *limiter.Limiter }

func (d directAdmin) Decide(ctx context.Context, req decision.Request) ([]limiter.Verdict, error) {
	return d.Limiter.Decide(ctx, req.Hits)
}

func adminEntries(kv ...string) []*adminv1.Entry {
	var es []*adminv1.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, &adminv1.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// adminHit sends one ShouldRateLimit for one descriptor of domain adm and
// returns its status.
func adminHit(t *testing.T, s *Service, kv ...string) *rlsv3.RateLimitResponse_DescriptorStatus {
	t.Helper()
	d := &rlcommon.RateLimitDescriptor{}
	for _, e := range adminEntries(kv...) {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
	}
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "adm", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Statuses[0]
}

func inspect(t *testing.T, a *Admin, kv ...string) *adminv1.InspectResponse {
	t.Helper()
	resp, err := a.Inspect(context.Background(), &adminv1.InspectRequest{Domain: "adm", Entries: adminEntries(kv...)})
	if err != nil {
		t.Fatalf("Inspect %v: %v", kv, err)
	}
	return resp
}

func TestAdminInspectDoesNotConsume(t *testing.T) {
	cases := []struct {
		key, algorithm, unit, failureMode, name string
		multiplier                              uint32
		line                                    int
		storeKey                                string
		resetAfter                              time.Duration // 10 s into the window, 3 hits
	}{
		// The frozen clock gives the log's three hits the scores now, now+1 µs
		// and now+2 µs: the newest leaves the window a minute after it.
		{"log", "sliding_window_log", "MINUTE", "deny", "by_log", 1, 3, "rl:{adm|log=a}:log:60", time.Minute + 2*time.Microsecond},
		{"counter", "sliding_window_counter", "MINUTE", "defer", "", 1, 5, "rl:{adm|counter=a}:counter:60", 2*time.Minute - 10*time.Second},
		{"fixed", "fixed_window", "SECOND", "defer", "", 60, 7, "rl:{adm|fixed=a}:fixed:60", time.Minute - 10*time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.algorithm, func(t *testing.T) {
			s, a, m := newAdminTest(t, nil)
			fresh := inspect(t, a, tc.key, "a")
			if !fresh.Matched || fresh.Used != 0 || fresh.Remaining != 5 || fresh.ResetAfter.AsDuration() != 0 {
				t.Fatalf("fresh counter: %v, want matched, 0 used, 5 left, reset now", fresh)
			}
			m.SetTime(adminEpoch.Add(10 * time.Second))
			for i := 0; i < 3; i++ {
				adminHit(t, s, tc.key, "a")
			}
			first := inspect(t, a, tc.key, "a")
			second := inspect(t, a, tc.key, "a")
			if !proto.Equal(first, second) {
				t.Fatalf("two inspections differ:\n%v\n%v", first, second)
			}
			want := &adminv1.InspectResponse{
				Matched:         true,
				Rule:            &adminv1.Rule{Id: "adm: " + tc.key, Name: tc.name, Source: "admin.yaml:" + strconv.Itoa(tc.line)},
				Algorithm:       tc.algorithm,
				RequestsPerUnit: 5,
				Unit:            tc.unit,
				UnitMultiplier:  tc.multiplier,
				FailureMode:     tc.failureMode,
				Key:             tc.storeKey,
				Used:            3,
				Remaining:       2,
			}
			got := proto.Clone(first).(*adminv1.InspectResponse)
			if got.Window.AsDuration() != time.Minute {
				t.Errorf("window %v, want 1m", got.Window.AsDuration())
			}
			if got.ResetAfter.AsDuration() != tc.resetAfter {
				t.Errorf("reset_after %v, want %v", got.ResetAfter.AsDuration(), tc.resetAfter)
			}
			got.Window, got.ResetAfter = nil, nil
			if !proto.Equal(got, want) {
				t.Fatalf("Inspect:\n got %v\nwant %v", got, want)
			}
			if !m.Exists(tc.storeKey) && !m.Exists(tc.storeKey+":28333440") {
				t.Errorf("the inspected key %q is not the one decided on: keys %q", tc.storeKey, m.Keys())
			}
			// Nothing was consumed: the next request sees 2 left, takes one.
			if st := adminHit(t, s, tc.key, "a"); st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 1 {
				t.Fatalf("request after the inspections: %v, want OK with 1 left", st)
			}
		})
	}
}

// TestAdminInspectCounterEstimate pins what used means for the sliding
// window counter: the weighted estimate, rounded up.
func TestAdminInspectCounterEstimate(t *testing.T) {
	s, a, m := newAdminTest(t, nil)
	m.SetTime(adminEpoch.Add(-30 * time.Second))
	for i := 0; i < 4; i++ {
		adminHit(t, s, "counter", "c")
	}
	// 20 s into the next window the previous one weighs 40/60:
	// 4 * 2/3 + 1 = 3.67.
	m.SetTime(adminEpoch.Add(20 * time.Second))
	adminHit(t, s, "counter", "c")
	got := inspect(t, a, "counter", "c")
	if got.Used != 4 || got.Remaining != 1 {
		t.Fatalf("used %d, remaining %d; want 4 (3.67 rounded up) and 1", got.Used, got.Remaining)
	}
	if st := adminHit(t, s, "counter", "c"); st.LimitRemaining != 0 || st.Code != rlsv3.RateLimitResponse_OK {
		t.Fatalf("request after the inspection: %v, want the last one admitted", st)
	}
}

func TestAdminResetClears(t *testing.T) {
	for _, key := range []string{"log", "counter", "fixed"} {
		t.Run(key, func(t *testing.T) {
			s, a, m := newAdminTest(t, nil)
			// Hits in the previous window and in this one.
			m.SetTime(adminEpoch.Add(-5 * time.Second))
			for i := 0; i < 2; i++ {
				adminHit(t, s, key, "r")
			}
			m.SetTime(adminEpoch.Add(5 * time.Second))
			for i := 0; i < 2; i++ {
				adminHit(t, s, key, "r")
			}
			adminHit(t, s, key, "other")
			before := inspect(t, a, key, "r")
			if before.Used == 0 {
				t.Fatalf("before the reset: %v, want something used", before)
			}

			resp, err := a.Reset(context.Background(), &adminv1.ResetRequest{Domain: "adm", Entries: adminEntries(key, "r")})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Key != before.Key || resp.Deleted == 0 {
				t.Fatalf("Reset: %v, want key %q and something deleted", resp, before.Key)
			}
			for _, k := range m.Keys() {
				// A counter's state stays only as a Reset leaves it: empty but
				// for its generation (reset.lua).
				if v, _ := m.Get(k); strings.HasPrefix(k, before.Key) && !regexp.MustCompile(`^0:0/1$`).MatchString(v) {
					t.Errorf("key %q left after the reset, holding %q", k, v)
				}
			}
			after := inspect(t, a, key, "r")
			if after.Used != 0 || after.Remaining != 5 || after.ResetAfter.AsDuration() != 0 {
				t.Fatalf("after the reset: %v, want 0 used, 5 left, reset now", after)
			}
			if other := inspect(t, a, key, "other"); other.Used != 1 {
				t.Fatalf("another descriptor's counter: %v, want untouched (1 used)", other)
			}
			if st := adminHit(t, s, key, "r"); st.LimitRemaining != 4 {
				t.Fatalf("request after the reset: %v, want 4 left", st)
			}

			// Resetting an empty counter is no error.
			if _, err := a.Reset(context.Background(), &adminv1.ResetRequest{Domain: "adm", Entries: adminEntries(key, "r")}); err != nil {
				t.Fatal(err)
			}
			again, err := a.Reset(context.Background(), &adminv1.ResetRequest{Domain: "adm", Entries: adminEntries(key, "r")})
			if err != nil || again.Deleted != 0 {
				t.Fatalf("second reset: %v, %v; want 0 deleted", again, err)
			}
		})
	}
}

func TestAdminInvalidArgument(t *testing.T) {
	_, a, _ := newAdminTest(t, &Options{MaxEntries: 2})
	cases := map[string]struct {
		domain  string
		entries []*adminv1.Entry
	}{
		"empty domain":  {"", adminEntries("log", "a")},
		"no entries":    {"adm", nil},
		"empty key":     {"adm", adminEntries("", "a")},
		"nil entry":     {"adm", []*adminv1.Entry{nil}},
		"three entries": {"adm", adminEntries("a", "1", "b", "2", "c", "3")},
	}
	for name, tc := range cases {
		_, err := a.Inspect(context.Background(), &adminv1.InspectRequest{Domain: tc.domain, Entries: tc.entries})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("Inspect, %s: %v, want InvalidArgument", name, err)
		}
		_, err = a.Reset(context.Background(), &adminv1.ResetRequest{Domain: tc.domain, Entries: tc.entries})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("Reset, %s: %v, want InvalidArgument", name, err)
		}
	}
}

func TestAdminNoCounter(t *testing.T) {
	_, a, m := newAdminTest(t, nil)
	for _, req := range []*adminv1.InspectRequest{
		{Domain: "adm", Entries: adminEntries("nothing", "x")},
		{Domain: "unknown", Entries: adminEntries("log", "x")},
	} {
		resp, err := a.Inspect(context.Background(), req)
		if err != nil || !proto.Equal(resp, &adminv1.InspectResponse{}) {
			t.Errorf("Inspect %v: %v, %v; want an empty answer, matched false", req, resp, err)
		}
		_, err = a.Reset(context.Background(), &adminv1.ResetRequest{Domain: req.Domain, Entries: req.Entries})
		if status.Code(err) != codes.NotFound {
			t.Errorf("Reset %v: %v, want NotFound", req, err)
		}
	}

	free := inspect(t, a, "free", "x")
	want := &adminv1.InspectResponse{Matched: true, Unlimited: true, Rule: &adminv1.Rule{Id: "adm: free", Source: "admin.yaml:9"}}
	if !proto.Equal(free, want) {
		t.Errorf("Inspect of an unlimited rule: %v, want %v", free, want)
	}
	_, err := a.Reset(context.Background(), &adminv1.ResetRequest{Domain: "adm", Entries: adminEntries("free", "x")})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "unlimited") {
		t.Errorf("Reset of an unlimited rule: %v, want NotFound saying unlimited", err)
	}
	if keys := m.Keys(); len(keys) != 0 {
		t.Errorf("keys written: %q", keys)
	}
}

// downStore fails as an unreachable store does.
type downStore struct{}

func (downStore) Decide(_ context.Context, req decision.Request) ([]limiter.Verdict, error) {
	return make([]limiter.Verdict, len(req.Hits)), errors.Join(limiter.ErrStore, errors.New("connection refused"))
}

func (downStore) Reset(context.Context, limiter.Hit) (int64, error) {
	return 0, errors.Join(limiter.ErrStore, errors.New("connection refused"))
}

func TestAdminStoreDown(t *testing.T) {
	s, _, _ := newAdminTest(t, nil)
	a := NewAdmin(s, downStore{})
	_, err := a.Inspect(context.Background(), &adminv1.InspectRequest{Domain: "adm", Entries: adminEntries("log", "a")})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Inspect: %v, want Unavailable", err)
	}
	_, err = a.Reset(context.Background(), &adminv1.ResetRequest{Domain: "adm", Entries: adminEntries("log", "a")})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Reset: %v, want Unavailable", err)
	}
	// A store failure the caller caused by giving up is told as such.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Reset(ctx, &adminv1.ResetRequest{Domain: "adm", Entries: adminEntries("log", "a")}); status.Code(err) != codes.Canceled {
		t.Errorf("Reset, canceled: %v, want Canceled", err)
	}
}

// TestAdminOverGRPC serves the admin service as internal/app does, on its own
// server with reflection, and uses it through a client.
func TestAdminOverGRPC(t *testing.T) {
	s, a, _ := newAdminTest(t, nil)
	ln := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	RegisterAdmin(srv, a)
	reflection.Register(srv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})

	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx := context.Background()

	// Reflection lists the service and serves its file, as grpcurl needs.
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	listed, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, svc := range listed.GetListServicesResponse().GetService() {
		names = append(names, svc.Name)
	}
	if !strings.Contains(strings.Join(names, " "), "ratelimit.admin.v1.Admin") {
		t.Fatalf("reflection lists %q, want ratelimit.admin.v1.Admin", names)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "ratelimit.admin.v1.Admin.Inspect"},
	}); err != nil {
		t.Fatal(err)
	}
	file, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(file.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
		t.Fatalf("no file descriptor for Inspect: %v", file)
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}

	client := adminv1.NewAdminClient(conn)
	adminHit(t, s, "log", "g")
	got, err := client.Inspect(ctx, &adminv1.InspectRequest{Domain: "adm", Entries: adminEntries("log", "g")})
	if err != nil || got.Used != 1 || got.Key != "rl:{adm|log=g}:log:60" {
		t.Fatalf("Inspect over gRPC: %v, %v", got, err)
	}
	reset, err := client.Reset(ctx, &adminv1.ResetRequest{Domain: "adm", Entries: adminEntries("log", "g")})
	if err != nil || reset.Deleted != 1 || reset.Key != got.Key {
		t.Fatalf("Reset over gRPC: %v, %v", reset, err)
	}
	if _, err := client.Inspect(ctx, &adminv1.InspectRequest{Domain: "adm"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("bad Inspect over gRPC: %v, want InvalidArgument", err)
	}
	if _, err := client.Reset(ctx, &adminv1.ResetRequest{Domain: "adm", Entries: adminEntries("none", "x")}); status.Code(err) != codes.NotFound {
		t.Fatalf("unmatched Reset over gRPC: %v, want NotFound", err)
	}
}
