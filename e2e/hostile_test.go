package e2e

// Hostile input at the default flags: values a client controls (long, not
// UTF-8) and descriptors without entries never fail a request; the other
// descriptors of the request keep their exact limits, and the hostile value
// is limited on its own counter like any other.

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

const hostileConfig = `
domain: hostile
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: user_agent
    rate_limit: {unit: hour, requests_per_unit: 3, algorithm: sliding_window_log}
`

// rawRequest is a RateLimitRequest already encoded, sent as it is: Go's
// proto encoder refuses strings that are not UTF-8, Envoy's does not.
type rawRequest []byte

// rawCodec sends rawRequest as it is and decodes answers with proto.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(rawRequest))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}

// encode writes req by hand, strings as bytes, whatever they hold.
func encode(req *rlsv3.RateLimitRequest) rawRequest {
	b := protowire.AppendTag(nil, 1, protowire.BytesType)
	b = protowire.AppendString(b, req.Domain)
	for _, d := range req.Descriptors {
		var db []byte
		for _, e := range d.Entries {
			var eb []byte
			eb = protowire.AppendTag(eb, 1, protowire.BytesType)
			eb = protowire.AppendString(eb, e.Key)
			eb = protowire.AppendTag(eb, 2, protowire.BytesType)
			eb = protowire.AppendString(eb, e.Value)
			db = protowire.AppendTag(db, 1, protowire.BytesType)
			db = protowire.AppendBytes(db, eb)
		}
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, db)
	}
	return b
}

// askRaw sends req encoded by hand; it fails the test on any gRPC error.
func (s *server) askRaw(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var resp rlsv3.RateLimitResponse
	err := s.conn.Invoke(ctx, "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", encode(req), &resp,
		grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return &resp
}

func TestHostileInput(t *testing.T) {
	t.Parallel()
	onEachGRPCServer(t, func(t *testing.T, kind string) {
		r := startRedis(t)
		s := startServer(t, r, hostileConfig, "--grpc-server", kind) // default bounds
		empty := func() *rlcommon.RateLimitDescriptor { return &rlcommon.RateLimitDescriptor{} }
		cases := []struct {
			name  string
			value string // of user_agent; "" for the empty descriptor case
		}{
			{"10 KiB value", strings.Repeat("a", 10<<10)},
			{"100 KiB value", strings.Repeat("b", 100<<10)},
			{"invalid UTF-8", "curl/\xff\xfe\xc3(\x80"},
			{"long invalid UTF-8", strings.Repeat("\xff", 1000)},
			{"empty descriptor", ""},
		}
		for i, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				addr := "192.0.2." + strconv.Itoa(i+1)
				hostile := descriptor("user_agent", tc.value)
				if tc.value == "" {
					hostile = empty()
				}
				// Four requests: the address admits exactly 3; the hostile
				// descriptor, limited to 3 too, fills with it; the empty one is
				// never limited. The fourth is denied, nothing charged.
				for n := 1; n <= 4; n++ {
					resp := s.askRaw(t, request("hostile", descriptor("remote_address", addr), hostile, empty()))
					wantCode, wantLeft := ok, uint32(3-n)
					if n == 4 {
						wantCode, wantLeft = over, 0
					}
					if len(resp.Statuses) != 3 {
						t.Fatalf("request %d: %d statuses, want 3", n, len(resp.Statuses))
					}
					if st := resp.Statuses[0]; st.Code != wantCode || st.LimitRemaining != wantLeft || st.CurrentLimit == nil {
						t.Fatalf("request %d: address %v, want %v with %d left", n, st, wantCode, wantLeft)
					}
					if st := resp.Statuses[2]; st.Code != ok || st.CurrentLimit != nil {
						t.Fatalf("request %d: empty descriptor %v, want OK without a limit", n, st)
					}
					st := resp.Statuses[1]
					if tc.value == "" {
						if st.Code != ok || st.CurrentLimit != nil {
							t.Fatalf("request %d: empty descriptor %v, want OK without a limit", n, st)
						}
						continue
					}
					if st.Code != wantCode || st.LimitRemaining != wantLeft || st.CurrentLimit == nil {
						t.Fatalf("request %d: hostile value %v, want %v with %d left", n, st, wantCode, wantLeft)
					}
				}
				if tc.value == "" {
					return
				}
				// The hostile value's own counter is full, from any address;
				// one byte more is another counter.
				if st := s.askRaw(t, request("hostile", hostile)).Statuses[0]; st.Code != over {
					t.Fatalf("the hostile value alone: %v, want OVER_LIMIT", st)
				}
				if st := s.askRaw(t, request("hostile", descriptor("user_agent", tc.value+"x"))).Statuses[0]; st.Code != ok || st.LimitRemaining != 2 {
					t.Fatalf("the hostile value and one byte: %v, want OK with 2 left", st)
				}
			})
		}
		// Keys stay short whatever the values: a long one is keyed by its
		// digest.
		keys, err := r.client.Keys(context.Background(), "rl:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if len(k) > 128 {
				t.Errorf("key of %d bytes: %.80q...", len(k), k)
			}
		}
		if got := metric(t, s, `ratelimit_invalid_requests_total{reason="empty_descriptor"}`); got != "" {
			t.Errorf("empty descriptors counted as invalid: %s", got)
		}
	})
}

// TestMessageSizeBound: --max-request-bytes (256 KiB by default) is gRPC's
// receive bound and POST /json's body bound. Within it, a request of long
// values is decided; past it, gRPC refuses with RESOURCE_EXHAUSTED before the
// service sees it, /json answers 413, and nothing is written.
func TestMessageSizeBound(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	s := startServer(t, r, hostileConfig)
	const bound = 256 << 10

	// Two descriptors that copy one 120 KiB header: 240 KiB, within.
	header := strings.Repeat("h", 120<<10)
	within := request("hostile", descriptor("user_agent", header), descriptor("user_agent", header))
	if size := proto.Size(within); size >= bound {
		t.Fatalf("the request within the bound is %d bytes", size)
	}
	resp := s.ask(t, within)
	if resp.OverallCode != ok || resp.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("a request within the bound: %v", resp)
	}

	keys := dbSize(t, r)
	past := request("hostile", descriptor("user_agent", strings.Repeat("p", bound)))
	_, err := s.rls.ShouldRateLimit(context.Background(), past)
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "larger than max") {
		t.Fatalf("a %d-byte request: %v, want RESOURCE_EXHAUSTED from gRPC's receive bound", proto.Size(past), err)
	}
	// The connection and the service survive it.
	if st := s.ask(t, request("hostile", descriptor("remote_address", "after"))).Statuses[0]; st.Code != ok || st.LimitRemaining != 2 {
		t.Fatalf("after an oversized request: %v", st)
	}

	body := `{"domain":"hostile","descriptors":[{"entries":[{"key":"user_agent","value":"` + strings.Repeat("j", bound) + `"}]}]}`
	resp2, err := http.Post("http://"+s.httpAddr+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp2.Body.Close() // only the status is asked
	if resp2.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a %d-byte /json body: %d, want 413", len(body), resp2.StatusCode)
	}
	if got := dbSize(t, r) - keys; got != 1 { // the "after" request's counter only
		t.Fatalf("oversized requests wrote %d keys", got-1)
	}
}

// TestIdleJSONBodyHoldsNoPlace: a POST /json whose body never comes holds
// no --max-inflight place: a request takes one once its body has come, so
// the only place stays free for the gRPC calls meanwhile.
func TestIdleJSONBodyHoldsNoPlace(t *testing.T) {
	r := startRedis(t)
	s := startServer(t, r, hostileConfig, "--max-inflight", "1")
	// Headers announce a body that never comes.
	conn, err := net.Dial("tcp", s.httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("POST /json HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")); err != nil {
		t.Fatal(err)
	}
	// For a second, while the server has read those headers and waits for
	// the body, every gRPC call finds the place free.
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		if _, err := s.rls.ShouldRateLimit(context.Background(), request("hostile", descriptor("remote_address", "idle"))); err != nil {
			t.Fatalf("a gRPC call while a POST /json waits for its body: %v", err)
		}
	}
}
