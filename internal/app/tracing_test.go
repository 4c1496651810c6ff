package app

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/slidingwindow/ratelimit/internal/settings"
)

// otlpReceiver is an OTLP/HTTP trace endpoint keeping what it receives.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	attrs map[string]string // resource attributes
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	var export coltrace.ExportTraceServiceRequest
	if req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &export) != nil {
		http.Error(w, "not a trace export", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range export.ResourceSpans {
		for _, kv := range rs.Resource.GetAttributes() {
			r.attrs[kv.Key] = kv.Value.GetStringValue()
		}
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out) // the exporter sees a failed write; the test sees the spans it sent
}

// TestTracingExportsCallSpans: with the reference's variables, a call is
// exported as a server span, child of the caller's traceparent or b3.
func TestTracingExportsCallSpans(t *testing.T) {
	recv := &otlpReceiver{attrs: map[string]string{}}
	srv := httptest.NewServer(recv)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("TRACING_ENABLED", "true")
	t.Setenv("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system")
	t.Setenv("TRACING_SERVICE_INSTANCE_ID", "ratelimit-0")
	var s settings.Settings
	if err := settings.Parse(settings.NewFlagSet("test", &s, io.Discard), &s, nil); err != nil {
		t.Fatal(err)
	}
	_, intercept, stop, err := startTracing(context.Background(), &s.Tracing)
	if err != nil || intercept == nil {
		t.Fatalf("tracing not started: %v", err)
	}
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	info := &grpc.UnaryServerInfo{FullMethod: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}
	handler := func(context.Context, any) (any, error) {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
	}
	for _, md := range []metadata.MD{
		metadata.Pairs("traceparent", "00-"+traceID+"-"+parentID+"-01"),
		metadata.Pairs("b3", traceID+"-"+parentID+"-1"),
	} {
		ctx := metadata.NewIncomingContext(context.Background(), md)
		if _, err := intercept(ctx, &rlsv3.RateLimitRequest{Domain: "edge"}, info, handler); err != nil {
			t.Fatal(err)
		}
	}
	if err := stop(context.Background()); err != nil { // flushes
		t.Fatal(err)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.spans) != 2 {
		t.Fatalf("%d spans exported, want 2", len(recv.spans))
	}
	for _, sp := range recv.spans {
		if sp.Name != "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" || sp.Kind != tracepb.Span_SPAN_KIND_SERVER ||
			hex.EncodeToString(sp.TraceId) != traceID || hex.EncodeToString(sp.ParentSpanId) != parentID {
			t.Errorf("span %q kind %v trace %x parent %x", sp.Name, sp.Kind, sp.TraceId, sp.ParentSpanId)
		}
		attrs := map[string]string{}
		for _, kv := range sp.Attributes {
			attrs[kv.Key] = kv.Value.GetStringValue()
		}
		if attrs["ratelimit.domain"] != "edge" || attrs["ratelimit.overall_code"] != "OVER_LIMIT" {
			t.Errorf("span attributes %v", attrs)
		}
	}
	for k, v := range map[string]string{"service.name": "RateLimit", "service.namespace": "envoy-gateway-system", "service.instance.id": "ratelimit-0"} {
		if recv.attrs[k] != v {
			t.Errorf("resource %s = %q, want %q", k, recv.attrs[k], v)
		}
	}
}
