package limiter

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/luastore"
)

// batchSpans returns the batch spans rec saw end.
func batchSpans(rec *tracetest.SpanRecorder) []sdktrace.ReadOnlySpan {
	var spans []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == batchSpanName {
			spans = append(spans, s)
		}
	}
	return spans
}

func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	attrs := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		attrs[kv.Key] = kv.Value
	}
	return attrs
}

// TestBatchSpanLinksItsRequests: a batch of two requests is one span, a
// root of its own (the batch outlives any one caller), linked to both
// requests' spans and saying what it sent where.
func TestBatchSpanLinksItsRequests(t *testing.T) {
	m, _ := luastore.RunT(t)
	m.SetTime(epoch)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	b := newBatcher(client, 5*time.Second, singleRouter{client}.node, tp.Tracer(tracerName))
	defer b.close()
	if err := b.prepare(context.Background()); err != nil {
		t.Fatal(err)
	}
	tracer := tp.Tracer("test")
	var batch []*call
	var want []trace.SpanContext
	for i := range 2 {
		ctx, span := tracer.Start(context.Background(), "request")
		defer span.End()
		h := hit(config.FixedWindow, fmt.Sprint(i), 5, time.Minute, 1)
		arg, err := hitArg(&h, &requestRule{}, epoch)
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, &call{ctx: ctx, deadline: time.Now().Add(5 * time.Second), slot: 0,
			keys: []string{h.Key}, args: []any{1, arg}, done: make(chan outcome, 1)})
		want = append(want, span.SpanContext())
	}
	b.exec(batch)
	for i, c := range batch {
		if o := <-c.done; o.err != nil || len(o.vals) != 4 || o.vals[0] != 2 {
			t.Fatalf("request %d: %v %v, want charged", i, o.vals, o.err)
		}
	}
	spans := batchSpans(rec)
	if len(spans) != 1 {
		t.Fatalf("%d batch spans, want 1", len(spans))
	}
	s := spans[0]
	if s.Parent().IsValid() || s.SpanKind() != trace.SpanKindClient {
		t.Errorf("batch span has parent %v and kind %v, want a root client span", s.Parent(), s.SpanKind())
	}
	var got []trace.SpanContext
	for _, l := range s.Links() {
		got = append(got, l.SpanContext)
	}
	if !slices.EqualFunc(got, want, trace.SpanContext.Equal) {
		t.Errorf("batch span links %v, want the requests' spans %v", got, want)
	}
	attrs := spanAttrs(s)
	if attrs["ratelimit.batch.requests"].AsInt64() != 2 || attrs["ratelimit.batch.hits"].AsInt64() != 2 ||
		attrs["server.address"].AsString() != m.Addr() || attrs["db.system.name"].AsString() != "redis" ||
		fmt.Sprint(attrs["ratelimit.redis.slots"].AsInt64Slice()) != "[0]" {
		t.Errorf("batch span attributes %v", attrs)
	}
	if op := attrs["db.operation.name"].AsString(); op != "FCALL" && op != "EVALSHA" {
		t.Errorf("db.operation.name %q, want FCALL or EVALSHA", op)
	}
	if s.Status().Code == codes.Error {
		t.Errorf("batch span status %v, want no error", s.Status())
	}
}

// TestLimiterBatchSpans: the limiter's batches use Options.TracerProvider,
// link the request's span, and record a store failure.
func TestLimiterBatchSpans(t *testing.T) {
	m, _ := luastore.RunT(t)
	m.SetTime(epoch)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1})
	defer client.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	l := New(client, &Options{Timeout: 5 * time.Second, DenyCache: -1, TracerProvider: tp})
	defer l.Close()
	ctx, span := tp.Tracer("test").Start(context.Background(), "request")
	defer span.End()
	if v, err := l.Decide(ctx, []Hit{hit(config.FixedWindow, "a", 5, time.Minute, 1)}); err != nil || !v[0].Charged {
		t.Fatalf("%+v %v, want charged", v, err)
	}
	spans := batchSpans(rec)
	if len(spans) != 1 || len(spans[0].Links()) != 1 || !spans[0].Links()[0].SpanContext.Equal(span.SpanContext()) {
		t.Fatalf("batch spans %v: want one, linked to the request's span", spans)
	}

	m.Close()
	if _, err := l.Decide(ctx, []Hit{hit(config.FixedWindow, "b", 5, time.Minute, 1)}); err == nil {
		t.Fatal("no error from a closed store")
	}
	spans = batchSpans(rec)
	if len(spans) != 2 {
		t.Fatalf("%d batch spans, want 2", len(spans))
	}
	s := spans[1]
	errorEvent := slices.ContainsFunc(s.Events(), func(e sdktrace.Event) bool { return e.Name == "exception" })
	if s.Status().Code != codes.Error || !errorEvent || spanAttrs(s)["ratelimit.redis.failed_commands"].AsInt64() != 1 {
		t.Errorf("failed batch: status %v, events %v, attributes %v: want the error recorded", s.Status(), s.Events(), s.Attributes())
	}
}
