package kubernetes

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// A buffered response body hands over each write of the server as soon as
// it arrives: a watch event never waits for the buffer to fill.
func TestBufferedBodiesDoNotHoldEvents(t *testing.T) {
	next := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, event := range []string{"first event", "second event"} {
			if _, err := io.WriteString(w, event); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	defer close(next)

	client := &http.Client{Transport: bufferedBodies{next: srv.Client().Transport}}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("test server answered over %s, want HTTP/2", resp.Proto)
	}
	if _, ok := resp.Body.(bufferedBody); !ok {
		t.Fatalf("body is a %T, not buffered", resp.Body)
	}
	for i, want := range []string{"first event", "second event"} {
		got := make(chan string, 1)
		go func() {
			buf := make([]byte, 1024)
			n, _ := resp.Body.Read(buf)
			got <- string(buf[:n])
		}()
		select {
		case g := <-got:
			if g != want {
				t.Fatalf("read %q, want %q", g, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("event %d not read within 30 s: the buffer holds it", i)
		}
		if i == 0 {
			next <- struct{}{}
		}
	}
}
