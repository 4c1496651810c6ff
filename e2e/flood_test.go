package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/slidingwindow/ratelimit/internal/service"
	"github.com/slidingwindow/ratelimit/internal/transport"
)

// floodPeakBound is the most peak RSS TestFloodOfMaximalRequests accepts:
// docs/reliability.md's bound for a flood of maximal requests at the default flags
// is the central manifest's 256 MiB container limit; this keeps a margin
// below it.
const floodPeakBound = 240 << 20

// TestFloodOfMaximalRequests: 1.5 times --max-inflight clients at once, so
// that the shedder refuses some, each sending requests of just under
// --max-request-bytes (64 descriptors of one long value each, distinct
// across requests), against the service at its default flags and runtime
// settings (GOGC and GOMEMLIMIT unset), built without the race detector,
// which multiplies memory. The service's peak RSS (VmHWM) stays under
// floodPeakBound, and every call is answered, refused as overloaded, or
// past its deadline: never an error of another kind.
func TestFloodOfMaximalRequests(t *testing.T) {
	// --log-level info undoes the harness's debug: every flag at its
	// default.
	peak, byCode, other := flood(t, "", "--log-level", "info")
	if other != nil {
		t.Fatalf("a call failed: %v", other)
	}
	if byCode[codes.OK] == 0 {
		t.Fatal("no request answered")
	}
	if peak > floodPeakBound {
		t.Fatalf("peak RSS %d MiB, want at most %d MiB", peak>>20, floodPeakBound>>20)
	}
}

// flood runs the flood of TestFloodOfMaximalRequests against a service
// built without the race detector, with GOGC unset, GOMEMLIMIT as given
// and the harness's flags and args. It returns the service's peak RSS, the
// calls' count by code, and a call's error of another code than OK,
// RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED or UNAVAILABLE, if any.
func flood(t *testing.T, gomemlimit string, args ...string) (peak int64, byCode map[codes.Code]int, other error) {
	t.Helper()
	// Empty is unset to the runtime and to the service alike.
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", gomemlimit)

	r := startRedis(t)
	s := startPlainServer(t, r, hostileConfig, args...)
	pid := s.cmd.Process.Pid

	const (
		clients = transport.DefaultMaxInFlight * 3 / 2
		conns   = 16 // as many Envoy workers' connections
		rounds  = 2
		values  = 64
	)
	maximal := newMaximalRequests(values)
	if size := len(maximal(clients, rounds)); size > service.DefaultMaxRequestBytes || size < service.DefaultMaxRequestBytes*9/10 {
		t.Fatalf("a maximal request is %d bytes, want just under %d", size, service.DefaultMaxRequestBytes)
	}
	var ccs []*grpc.ClientConn
	for range conns {
		cc, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ccs = append(ccs, cc)
	}

	var mu sync.Mutex
	byCode = map[codes.Code]int{}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			<-start
			for round := range rounds {
				req := maximal(c, round)
				// Generous: the test asserts memory and codes, not time.
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				err := ccs[c%conns].Invoke(ctx, shouldRateLimit, req, &rlsv3.RateLimitResponse{}, grpc.ForceCodecV2(marshaledCodec{}))
				cancel()
				code := status.Code(err)
				mu.Lock()
				byCode[code]++
				switch code {
				case codes.OK, codes.ResourceExhausted, codes.DeadlineExceeded, codes.Unavailable:
				default:
					other = err
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()

	peak, err := procStatus(pid, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d clients x %d requests of %d KiB on %d connections, GOMEMLIMIT=%q, flags %q: answers by code %v; peak RSS %d MiB (bound %d MiB)",
		clients, rounds, len(maximal(0, 0))>>10, conns, gomemlimit, args, byCode, peak>>20, floodPeakBound>>20)
	return peak, byCode, other
}

// procStatus reads a size field, such as VmRSS or VmHWM (the peak RSS),
// from /proc/<pid>/status, in bytes.
func procStatus(pid int, name string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == name+":" && f[2] == "kB" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", name, pid)
}

// shouldRateLimit is the method's full name, as Envoy calls it.
const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// newMaximalRequests returns the flood's requests, already marshaled: of
// values descriptors of one value each, which together make a request just
// under --max-request-bytes' default, each value distinct across requests by
// its prefix ("client-round-index-"). The clients send the bytes as they
// are (marshaledCodec): a request is one allocation in the test's process,
// not a message of 64 strings and its marshaled copy, so the test's own
// memory stays a fraction of what the flood makes the service hold.
func newMaximalRequests(values int) func(client, round int) []byte {
	valueLen := (service.DefaultMaxRequestBytes - values*32) / values
	prefix := func(client, round, i int) string { return fmt.Sprintf("%04d-%d-%02d-", client, round, i) }
	req := request("hostile")
	for i := range values {
		p := prefix(0, 0, i)
		req.Descriptors = append(req.Descriptors, descriptor("user_agent", p+strings.Repeat("v", valueLen-len(p))))
	}
	template, err := proto.Marshal(req)
	if err != nil {
		panic(err) // a message of strings always marshals
	}
	at := make([]int, values)
	for i := range values {
		at[i] = bytes.Index(template, []byte(prefix(0, 0, i)))
	}
	return func(client, round int) []byte {
		b := bytes.Clone(template)
		for i, off := range at {
			copy(b[off:], prefix(client, round, i))
		}
		return b
	}
}

// marshaledCodec sends a request already marshaled as it is, and decodes
// answers as grpc-go's proto codec does.
type marshaledCodec struct{}

func (marshaledCodec) Name() string { return "proto" }

func (marshaledCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (marshaledCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return proto.Unmarshal(data.Materialize(), v.(proto.Message))
}
