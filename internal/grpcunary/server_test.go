package grpcunary

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/slidingwindow/ratelimit/internal/tlsconfig/tlsconfigtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testService echoes payloads, answers the status a request asks for, and
// reports what its context held.
type testService struct {
	testgrpc.UnimplementedTestServiceServer
	seen    chan context.Context // UnaryCall's contexts, when set
	release chan struct{}        // UnaryCall waits for it (or its context), when set
}

func (s *testService) UnaryCall(ctx context.Context, r *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	if s.seen != nil {
		s.seen <- ctx
	}
	if s.release != nil {
		select {
		case <-s.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if st := r.GetResponseStatus(); st != nil {
		if st.Code == int32(codes.Unknown) {
			return nil, errors.New(st.Message) // not a status: UNKNOWN
		}
		return nil, status.Error(codes.Code(st.Code), st.Message)
	}
	resp := &testgrpc.SimpleResponse{Payload: r.GetPayload()}
	if n := r.GetResponseSize(); n > 0 {
		resp.Payload = &testgrpc.Payload{Body: bytes.Repeat([]byte{'r'}, int(n))}
	}
	return resp, nil
}

// FullDuplexCall echoes each request's payload, with the request's
// metadata value "x-tenant" in a header and a trailer.
func (s *testService) FullDuplexCall(stream testgrpc.TestService_FullDuplexCallServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	if err := stream.SetHeader(metadata.Pairs("x-tenant", strings.Join(md.Get("x-tenant"), ","))); err != nil {
		return err
	}
	stream.SetTrailer(metadata.Pairs("x-count-bin", "\x00\x01"))
	for {
		req, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if st := req.GetResponseStatus(); st != nil {
			return status.Error(codes.Code(st.Code), st.Message)
		}
		if err := stream.Send(&testgrpc.StreamingOutputCallResponse{Payload: req.GetPayload()}); err != nil {
			return err
		}
	}
}

// start serves svc on a Server with opts on a loopback port, and returns a
// client connection to it; both end with the test.
func start(t testing.TB, opts Options, svc *testService, dialOpts ...grpc.DialOption) (*Server, *grpc.ClientConn) {
	t.Helper()
	s := NewServer(opts)
	testgrpc.RegisterTestServiceServer(s, svc)
	healthpb.RegisterHealthServer(s, health.NewServer())
	reflection.Register(s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	if len(dialOpts) == 0 {
		dialOpts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	cc, err := grpc.NewClient(ln.Addr().String(), dialOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cc.Close(); err != nil {
			t.Errorf("closing the grpc-go client: %v", err)
		}
		s.Stop()
		if err := <-served; !errors.Is(err, ErrServerStopped) {
			t.Errorf("Serve: %v, want ErrServerStopped", err)
		}
	})
	return s, cc
}

func TestUnaryCalls(t *testing.T) {
	_, cc := start(t, Options{MaxRecvMsgSize: 1 << 20}, &testService{})
	client := testgrpc.NewTestServiceClient(cc)
	big := bytes.Repeat([]byte("0123456789abcdef"), 300<<10/16)
	tests := []struct {
		name     string
		req      *testgrpc.SimpleRequest
		wantCode codes.Code
		wantMsg  string
		wantBody []byte
	}{
		{name: "small echo", req: &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("hello")}}, wantBody: []byte("hello")},
		{name: "empty request", req: &testgrpc.SimpleRequest{}, wantBody: nil},
		{
			// Past the 64 KiB windows and 16 KiB frames both ways.
			name:     "300 KiB each way",
			req:      &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: big}, ResponseSize: 300 << 10},
			wantBody: bytes.Repeat([]byte{'r'}, 300<<10),
		},
		{
			name:     "status with a message to escape",
			req:      &testgrpc.SimpleRequest{ResponseStatus: &testgrpc.EchoStatus{Code: int32(codes.ResourceExhausted), Message: "quota 100% für\nheute"}},
			wantCode: codes.ResourceExhausted, wantMsg: "quota 100% für\nheute",
		},
		{
			name:     "an error that is not a status",
			req:      &testgrpc.SimpleRequest{ResponseStatus: &testgrpc.EchoStatus{Code: int32(codes.Unknown), Message: "plain"}},
			wantCode: codes.Unknown, wantMsg: "plain",
		},
		{
			name:     "message past MaxRecvMsgSize",
			req:      &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, 2<<20)}},
			wantCode: codes.ResourceExhausted, wantMsg: "grpc: received message larger than max",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := client.UnaryCall(ctx, tt.req)
			st := status.Convert(err)
			if st.Code() != tt.wantCode || !strings.HasPrefix(st.Message(), tt.wantMsg) {
				t.Fatalf("status %v %q, want %v %q", st.Code(), st.Message(), tt.wantCode, tt.wantMsg)
			}
			if err == nil && !bytes.Equal(resp.GetPayload().GetBody(), tt.wantBody) {
				t.Fatalf("body of %d bytes, want %d", len(resp.GetPayload().GetBody()), len(tt.wantBody))
			}
		})
	}
}

func TestMethodsNotServed(t *testing.T) {
	_, cc := start(t, Options{}, &testService{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tt := range []struct {
		method, want string
	}{
		{"/grpc.testing.TestService/Nope", "unknown method Nope for service grpc.testing.TestService"},
		{"/grpc.testing.Nothing/Call", "unknown service grpc.testing.Nothing"},
	} {
		err := cc.Invoke(ctx, tt.method, &testgrpc.Empty{}, &testgrpc.Empty{})
		if st := status.Convert(err); st.Code() != codes.Unimplemented || st.Message() != tt.want {
			t.Errorf("%s: %v, want UNIMPLEMENTED %q", tt.method, err, tt.want)
		}
	}
	health := healthpb.NewHealthClient(cc)
	if resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health Check: %v %v, want SERVING", resp, err)
	}
}

func TestStreamingCalls(t *testing.T) {
	s, cc := start(t, Options{MaxRecvMsgSize: 1 << 20}, &testService{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client := testgrpc.NewTestServiceClient(cc)

	t.Run("bidi echo with headers and trailers", func(t *testing.T) {
		stream, err := client.FullDuplexCall(metadata.AppendToOutgoingContext(ctx, "x-tenant", "a"))
		if err != nil {
			t.Fatal(err)
		}
		for i, size := range []int{0, 10, 100 << 10, 3} { // one past the 64 KiB windows
			body := bytes.Repeat([]byte{byte('a' + i)}, size)
			if err := stream.Send(&testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: body}}); err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if err != nil || !bytes.Equal(resp.GetPayload().GetBody(), body) {
				t.Fatalf("message %d: %v, %d bytes back, want %d", i, err, len(resp.GetPayload().GetBody()), size)
			}
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != io.EOF {
			t.Fatalf("after the last message: %v, want EOF", err)
		}
		if h, _ := stream.Header(); strings.Join(h.Get("x-tenant"), ",") != "a" {
			t.Errorf("header x-tenant %q, want a", h.Get("x-tenant"))
		}
		if tr := stream.Trailer(); strings.Join(tr.Get("x-count-bin"), ",") != "\x00\x01" {
			t.Errorf("trailer x-count-bin %q", tr.Get("x-count-bin"))
		}
	})

	t.Run("status from the handler", func(t *testing.T) {
		stream, err := client.FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		req := &testgrpc.StreamingOutputCallRequest{ResponseStatus: &testgrpc.EchoStatus{Code: int32(codes.PermissionDenied), Message: "no"}}
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("%v, want PERMISSION_DENIED", err)
		}
	})

	t.Run("health watch", func(t *testing.T) {
		watch, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := watch.Recv()
		if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%v %v, want SERVING", resp, err)
		}
	})

	t.Run("reflection", func(t *testing.T) {
		_ = s // reflection is registered by start
		stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, svc := range resp.GetListServicesResponse().GetService() {
			names = append(names, svc.Name)
		}
		if !slices.Contains(names, "grpc.testing.TestService") || !slices.Contains(names, "grpc.health.v1.Health") {
			t.Errorf("services %q", names)
		}
		if err := stream.CloseSend(); err != nil {
			t.Error(err)
		}
	})
}

func TestContextOfACall(t *testing.T) {
	var order []string
	var mu sync.Mutex
	interceptor := func(name string) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			mu.Lock()
			order = append(order, name+" "+info.FullMethod)
			mu.Unlock()
			return handler(ctx, req)
		}
	}
	svc := &testService{seen: make(chan context.Context, 1)}
	_, cc := start(t, Options{Interceptors: []grpc.UnaryServerInterceptor{interceptor("outer"), interceptor("inner")}}, svc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, "x-tenant", "a", "x-tenant", "b", "x-trace-bin", string([]byte{0, 1, 0xff}))
	if _, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{}); err != nil {
		t.Fatal(err)
	}
	got := <-svc.seen
	md, _ := metadata.FromIncomingContext(got)
	if v := md.Get("x-tenant"); len(v) != 2 || v[0] != "a" || v[1] != "b" {
		t.Errorf("x-tenant %q, want [a b]", v)
	}
	if v := md.Get("x-trace-bin"); len(v) != 1 || v[0] != string([]byte{0, 1, 0xff}) {
		t.Errorf("x-trace-bin %q, want the bytes sent", v)
	}
	if v := md.Get("user-agent"); len(v) != 1 || !strings.Contains(v[0], "grpc-go") {
		t.Errorf("user-agent %q", v)
	}
	for _, reserved := range []string{"grpc-timeout", "content-type", "te", ":path"} {
		if v := md.Get(reserved); len(v) != 0 {
			t.Errorf("%s in metadata: %q", reserved, v)
		}
	}
	deadline, ok := got.Deadline()
	if want, _ := ctx.Deadline(); !ok || deadline.Sub(want).Abs() > time.Second {
		t.Errorf("deadline %v (%v), want about %v", deadline, ok, want)
	}
	// The handler has returned: the call's context is over.
	select {
	case <-got.Done():
	case <-time.After(5 * time.Second):
		t.Error("the context of a finished call is not done")
	}
	want := "outer /grpc.testing.TestService/UnaryCall,inner /grpc.testing.TestService/UnaryCall"
	if strings.Join(order, ",") != want {
		t.Errorf("interceptors ran %q, want %q", order, want)
	}
}

func TestCancelReachesTheHandler(t *testing.T) {
	svc := &testService{seen: make(chan context.Context, 1), release: make(chan struct{})}
	_, cc := start(t, Options{}, svc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{})
		done <- err
	}()
	handlerCtx := <-svc.seen
	cancel() // grpc-go sends RST_STREAM (CANCEL)
	select {
	case <-handlerCtx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the handler's context was not canceled by the client's reset")
	}
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Errorf("client: %v, want CANCELED", err)
	}
}

func TestAdmitRefusesOnceTheMessageIsWhole(t *testing.T) {
	var admitted, done atomic.Int32
	admit := func() AdmitFunc {
		return func(method string) (func(), error) {
			if method != "/grpc.testing.TestService/UnaryCall" {
				return nil, nil
			}
			if admitted.Add(1) > 1 {
				return nil, status.Error(codes.ResourceExhausted, "one at a time")
			}
			return func() { done.Add(1) }, nil
		}
	}
	svc := &testService{seen: make(chan context.Context, 1), release: make(chan struct{})}
	_, cc := start(t, Options{NewConnAdmit: admit}, svc)
	client := testgrpc.NewTestServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := make(chan error, 1)
	go func() {
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		first <- err
	}()
	<-svc.seen
	// Refused once its 1 MiB message is whole, before its handler.
	_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, 1<<20)}})
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || st.Message() != "one at a time" {
		t.Errorf("second call: %v, want RESOURCE_EXHAUSTED from Admit", err)
	}
	if h := healthpb.NewHealthClient(cc); true {
		if _, err := h.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("health check through Admit: %v", err)
		}
	}
	close(svc.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// done runs once the answer is written: the client may see it first.
	if !waitFor(func() bool { return done.Load() == 1 }, 5*time.Second) {
		t.Errorf("done ran %d times for the admitted call, want once", done.Load())
	}
}

func TestManyConcurrentCalls(t *testing.T) {
	_, cc := start(t, Options{}, &testService{})
	client := testgrpc.NewTestServiceClient(cc)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 64 {
		wg.Go(func() {
			for i := range 100 {
				body := []byte(fmt.Sprintf("caller %d call %d %s", g, i, strings.Repeat("x", i*37)))
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: body}})
				cancel()
				if err == nil && !bytes.Equal(resp.GetPayload().GetBody(), body) {
					err = fmt.Errorf("caller %d call %d: another call's answer", g, i)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestGracefulStopAnswersCallsInFlight(t *testing.T) {
	svc := &testService{seen: make(chan context.Context, 1), release: make(chan struct{})}
	s, cc := start(t, Options{}, svc)
	client := testgrpc.NewTestServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inFlight := make(chan error, 1)
	go func() {
		_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{})
		inFlight <- err
	}()
	<-svc.seen
	stopped := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with a call in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(svc.release)
	if err := <-inFlight; err != nil {
		t.Fatalf("the call in flight: %v", err)
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("GracefulStop did not return once the call was answered")
	}
	if _, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(false)); status.Code(err) != codes.Unavailable {
		t.Errorf("a call after the stop: %v, want UNAVAILABLE", err)
	}
}

func TestStopCancelsCallsInFlight(t *testing.T) {
	svc := &testService{seen: make(chan context.Context, 1), release: make(chan struct{})}
	s, cc := start(t, Options{}, svc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The call fails when Stop cancels it; what is checked is its handler's context.
	go func() { _, _ = testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{}) }()
	handlerCtx := <-svc.seen
	s.Stop() // returns once the handler has
	if handlerCtx.Err() == nil {
		t.Error("Stop returned and the call's context is not canceled")
	}
}

// countingListener counts the connections it accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

func TestMaxConnectionAgeMovesClientsWithoutFailedCalls(t *testing.T) {
	s := NewServer(Options{MaxConnectionAge: 100 * time.Millisecond, MaxConnectionAgeGrace: time.Second})
	testgrpc.RegisterTestServiceServer(s, &testService{})
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: inner}
	serveTillCleanup(t, s, ln)
	defer s.Stop()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := testgrpc.NewTestServiceClient(cc)
	var wg sync.WaitGroup
	var failed atomic.Int32
	var calls atomic.Int32
	until := time.Now().Add(time.Second)
	for range 8 {
		wg.Go(func() {
			for time.Now().Before(until) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				// WaitForReady: between connections the channel is
				// reconnecting, and a call waits for it rather than fail.
				_, err := client.UnaryCall(ctx, &testgrpc.SimpleRequest{}, grpc.WaitForReady(true))
				cancel()
				calls.Add(1)
				if err != nil {
					failed.Add(1)
					t.Errorf("call: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if n := ln.accepted.Load(); n < 2 {
		t.Errorf("%d connections in a second with a 100 ms age, want several", n)
	}
	t.Logf("%d calls on %d connections, %d failed", calls.Load(), ln.accepted.Load(), failed.Load())
}

func TestTLS(t *testing.T) {
	ca := tlsconfigtest.NewCA(t, "test CA")
	leaf := ca.Server(t, "server")
	cert, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	// The certificate comes from GetConfigForClient, as with reloaded files:
	// h2 must be offered on that config too.
	serverTLS := &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
	}}
	creds := credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost"})
	_, cc := start(t, Options{TLS: serverTLS}, &testService{}, grpc.WithTransportCredentials(creds))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := testgrpc.NewTestServiceClient(cc).UnaryCall(ctx, &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("over TLS")}})
	if err != nil || string(resp.GetPayload().GetBody()) != "over TLS" {
		t.Fatalf("%v %v", resp, err)
	}
}

// TestNotGRPC sends what a plain HTTP/2 client would: an HTTP status, not a
// gRPC one, answers it.
func TestNotGRPC(t *testing.T) {
	s := NewServer(Options{})
	testgrpc.RegisterTestServiceServer(s, &testService{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveTillCleanup(t, s, ln)
	defer s.Stop()
	// HTTP/2 without TLS, by prior knowledge.
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &protocols}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	url := "http://" + ln.Addr().String() + "/grpc.testing.TestService/UnaryCall"
	for _, tt := range []struct {
		method, contentType string
		want                int
	}{
		{"POST", "application/json", http.StatusUnsupportedMediaType},
		{"GET", "application/grpc", http.StatusMethodNotAllowed},
	} {
		req, _ := http.NewRequest(tt.method, url, nil)
		req.Header.Set("content-type", tt.contentType)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tt.method, tt.contentType, err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Errorf("%s %s: reading the body: %v", tt.method, tt.contentType, err)
		}
		if err := resp.Body.Close(); err != nil {
			t.Error(err)
		}
		if resp.StatusCode != tt.want {
			t.Errorf("%s %s: HTTP %d, want %d", tt.method, tt.contentType, resp.StatusCode, tt.want)
		}
	}
}

func TestParseTimeout(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"20m", 20 * time.Millisecond, true},
		{"19999u", 19999 * time.Microsecond, true},
		{"1S", time.Second, true},
		{"2M", 2 * time.Minute, true},
		{"1H", time.Hour, true},
		{"100n", 100, true},
		{"99999999H", 1 << 62, true}, // past what a Duration holds: capped
		{"123456789m", 0, false},     // 9 digits
		{"m", 0, false},
		{"10x", 0, false},
		{"-1m", 0, false},
	} {
		got, ok := parseTimeout(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseTimeout(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestEncodeGRPCMessage(t *testing.T) {
	for in, want := range map[string]string{
		"plain text":   "plain text",
		"100%":         "100%25",
		"für\n":        "f%C3%BCr%0A",
		"":             "",
		"tab\there ~!": "tab%09here ~!",
	} {
		if got := encodeGRPCMessage(in); got != want {
			t.Errorf("encodeGRPCMessage(%q) = %q, want %q", in, got, want)
		}
	}
}
