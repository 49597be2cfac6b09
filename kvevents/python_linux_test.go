package kvevents

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/vmarena/vmarena/internal/testexec"
)

// TestPythonSubscriber: a subscriber on libzmq (pyzmq) and Python's
// msgpack — what routers in Python run — takes the stream live and
// through the replay socket, and decodes each batch to what this
// package's own decoding of the payload says, in both layouts, over tcp
// and over ipc endpoints. It skips
// where /usr/bin/python3 lacks zmq or msgpack (Debian's python3-zmq and
// python3-msgpack have them).
func TestPythonSubscriber(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import zmq, msgpack").Run(); err != nil {
		t.Skip("no python3 with zmq and msgpack (apt-get install python3-zmq python3-msgpack)")
	}
	for _, c := range []struct {
		layout Layout
		ipc    bool
	}{{Array, false}, {Map, false}, {Array, true}} {
		layout := c.layout
		const n = 120
		two := 2
		var p *Publisher
		if c.ipc {
			dir := shortDir(t)
			var err error
			p, err = New(Options{Endpoint: "ipc://" + dir + "/pub", ReplayEndpoint: "ipc://" + dir + "/replay", Layout: layout, Topic: "kv", Rank: &two})
			require.NoError(t, err)
		} else {
			p = newPublisher(t, Options{Layout: layout, Topic: "kv", Rank: &two})
		}
		var payloads [][]byte
		publish := func(i int) {
			b := makeBatch(i, 0)
			payload, err := EncodeBatch(b, &two, layout)
			require.NoError(t, err)
			payloads = append(payloads, payload)
			p.Publish(b)
		}
		for i := range n / 2 {
			publish(i) // before it connects: replayed
		}
		ctx, cancel := testexec.Context(t)
		cmd := exec.CommandContext(ctx, "/usr/bin/python3", "testdata/pysub.py", p.Endpoint(), p.ReplayEndpoint(), "kv", strconv.Itoa(n))
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		lines := bufio.NewScanner(out)
		lines.Buffer(nil, 1<<24)
		require.True(t, lines.Scan(), stderr.String())
		require.Equal(t, "subscribed", lines.Text())
		for p.Stats().Subscribers == 0 {
			time.Sleep(time.Millisecond)
		}
		for i := n / 2; i < n; i++ {
			publish(i)
		}
		for i := range n {
			require.True(t, lines.Scan(), "batch %d: %s", i, stderr.String())
			var want any
			require.NoError(t, msgpack.Unmarshal(payloads[i], &want))
			want.([]any)[0] = fmt.Sprintf("%.6f", want.([]any)[0])
			w, err := json.Marshal(want)
			require.NoError(t, err)
			require.Equal(t, fmt.Sprintf("%d %s", i, w), lines.Text(), "layout %s", layout)
		}
		require.True(t, lines.Scan())
		require.Equal(t, "done", lines.Text())
		require.NoError(t, cmd.Wait(), stderr.String())
		cancel()
		require.Positive(t, p.Stats().Replays, "the first half came through the replay socket")
		require.NoError(t, p.Close())
	}
}
