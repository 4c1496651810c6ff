package app

import (
	"context"
	"crypto/rand"
	"fmt"

	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/slidingwindow/ratelimit/internal/settings"
)

// OpenTelemetry tracing of gRPC calls, with envoyproxy/ratelimit's settings
// (TRACING_* map to the --tracing* flags). The exporter's endpoint, headers,
// certificates and timeout come from the standard OTEL_EXPORTER_OTLP_*
// variables, which the exporter reads itself, as there.

// startTracing makes the tracer provider when --tracing is on and returns
// it (a no-op one when off), the interceptor that traces calls (nil when
// off) and the function that flushes and stops the exporter. The provider
// is handed to what starts spans (the interceptor, the limiter's Redis
// batches), not installed as OpenTelemetry's global one.
func startTracing(ctx context.Context, t *settings.Tracing) (trace.TracerProvider, grpc.UnaryServerInterceptor, func(context.Context) error, error) {
	if !t.Enabled {
		return noop.NewTracerProvider(), nil, func(context.Context) error { return nil }, nil
	}
	var client otlptrace.Client
	switch t.ExporterProtocol {
	case "http", "":
		client = otlptracehttp.NewClient()
	case "grpc":
		client = otlptracegrpc.NewClient()
	default:
		return nil, nil, nil, fmt.Errorf("--tracing-exporter-protocol=%q: http or grpc", t.ExporterProtocol)
	}
	exporter, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("tracing: %w", err)
	}
	instance := t.ServiceInstanceID
	if instance == "" {
		instance = randomUUID()
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.SamplingRate))),
		sdktrace.WithBatcher(exporter),
		sdktrace.WithResource(resource.NewSchemaless(
			attribute.String("service.name", t.ServiceName),
			attribute.String("service.namespace", t.ServiceNamespace),
			attribute.String("service.instance.id", instance),
		)),
	)
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, b3.New(), propagation.Baggage{})
	return tp, traceCalls(tp.Tracer("ratelimit"), prop), tp.Shutdown, nil
}

// traceCalls is a unary interceptor that runs each call in a server span,
// child of the context the caller propagated; ShouldRateLimit's span names
// its domain. It stands in for otelgrpc, which the service does not need
// whole.
func traceCalls(tracer trace.Tracer, prop propagation.TextMapPropagator) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		ctx = prop.Extract(ctx, metadataCarrier(md))
		ctx, span := tracer.Start(ctx, info.FullMethod[1:], trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("rpc.system", "grpc"), attribute.String("rpc.method", info.FullMethod)))
		defer span.End()
		if r, ok := req.(*rlsv3.RateLimitRequest); ok {
			span.SetAttributes(attribute.String("ratelimit.domain", r.Domain), attribute.Int("ratelimit.descriptors", len(r.Descriptors)))
		}
		resp, err := handler(ctx, req)
		if err != nil {
			st := status.Convert(err)
			span.SetStatus(codes.Error, st.Message())
			span.SetAttributes(attribute.String("rpc.grpc.status_code", st.Code().String()))
		} else if r, ok := resp.(*rlsv3.RateLimitResponse); ok {
			span.SetAttributes(attribute.String("ratelimit.overall_code", r.OverallCode.String()))
		}
		return resp, err
	}
}

// metadataCarrier reads propagation headers from gRPC metadata.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// randomUUID is a version 4 UUID.
func randomUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
