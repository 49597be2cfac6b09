package browsertest

import (
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// writeFile writes body to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, body string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(body), mode))
	return p
}

// writePNG writes a PNG of the window's size, white with a black square
// of side pixels in it.
func writePNG(t *testing.T, name string, side int) {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, WindowWidth, WindowHeight))
	for y := range WindowHeight {
		for x := range WindowWidth {
			c := color.RGBA{255, 255, 255, 255}
			if x >= 100 && x < 100+side && y >= 100 && y < 100+side {
				c = color.RGBA{0, 0, 0, 255}
			}
			img.Set(x, y, c)
		}
	}
	f, err := os.Create(name)
	require.NoError(t, err)
	require.NoError(t, png.Encode(f, img))
	require.NoError(t, f.Close())
}

// fakeChromium is a stand-in for the browser: it copies $FAKE_PNG to the
// screenshot it is asked for, says on stderr what $FAKE_LOG holds, and
// sleeps $FAKE_SLEEP seconds first.
const fakeChromium = `#!/bin/sh
sleep "${FAKE_SLEEP:-0}"
printf '%s' "$FAKE_LOG" >&2
for a; do
	case "$a" in
	--screenshot=*) [ -n "$FAKE_PNG" ] && cp "$FAKE_PNG" "${a#--screenshot=}" ;;
	esac
done
exit "${FAKE_EXIT:-0}"
`

// TestFind: VMARENA_CHROMIUM names the browser; one it names that is not
// there is an error; with none on the PATH the error names what was
// looked for.
func TestFind(t *testing.T) {
	dir := t.TempDir()
	fake := writeFile(t, dir, "my-chromium", fakeChromium, 0o755)
	t.Setenv(ChromiumEnv, fake)
	got, err := find()
	require.NoError(t, err)
	require.Equal(t, fake, got)
	t.Setenv(ChromiumEnv, filepath.Join(dir, "missing"))
	_, err = find()
	require.ErrorContains(t, err, ChromiumEnv+"=")
	t.Setenv(ChromiumEnv, "")
	t.Setenv("PATH", dir)
	_, err = find()
	require.ErrorContains(t, err, "none of chromium, chromium-browser, google-chrome on the PATH")
	writeFile(t, dir, "chromium-browser", fakeChromium, 0o755)
	got, err = find()
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "chromium-browser"), got)
}

// TestOpenStandIn runs Open on a stand-in browser: the console lines of
// its log are the page's messages and fail Err; a clean log and a drawn
// screenshot pass; a blank screenshot fails Err; no screenshot, one of
// the wrong size, a failing browser and one that runs past its context
// fail Open.
func TestOpenStandIn(t *testing.T) {
	dir := t.TempDir()
	fake := writeFile(t, dir, "chromium", fakeChromium, 0o755)
	page := writeFile(t, dir, "page.html", "<!DOCTYPE html><p>hi</p>", 0o644)
	drawnPNG, blankPNG, smallPNG := filepath.Join(dir, "drawn.png"), filepath.Join(dir, "blank.png"), filepath.Join(dir, "small.png")
	writePNG(t, drawnPNG, 200)
	writePNG(t, blankPNG, 0)
	small := image.NewRGBA(image.Rect(0, 0, 10, 10))
	f, err := os.Create(smallPNG)
	require.NoError(t, err)
	require.NoError(t, png.Encode(f, small))
	require.NoError(t, f.Close())
	open := func(env map[string]string, ctx context.Context) (Result, error) {
		for _, k := range []string{"FAKE_PNG", "FAKE_LOG", "FAKE_SLEEP", "FAKE_EXIT"} {
			t.Setenv(k, env[k])
		}
		return Open(ctx, fake, page, t.TempDir())
	}
	bg := context.Background()

	res, err := open(map[string]string{"FAKE_PNG": drawnPNG,
		"FAKE_LOG": "[1:1:1126/061157.182494:ERROR:dbus/object_proxy.cc:572] Failed to call method\n" +
			`[29161:29161:1126/061157.615942:INFO:CONSOLE:1] "boom", source: file:///tmp/bad.html (1)` + "\n" +
			`[29161:29161:1126/061157.615942:INFO:CONSOLE(3)] "Uncaught ReferenceError: f is not defined", source: file:///tmp/bad.html (3)` + "\n"}, bg)
	require.NoError(t, err)
	require.Equal(t, []string{`"boom", source: file:///tmp/bad.html (1)`, `"Uncaught ReferenceError: f is not defined", source: file:///tmp/bad.html (3)`}, res.Console)
	require.ErrorContains(t, res.Err(), `2 message(s) to its console: "boom"`)
	require.FileExists(t, res.Screenshot)

	res, err = open(map[string]string{"FAKE_PNG": drawnPNG, "FAKE_LOG": "[1:1:0:ERROR:dbus/bus.cc:405] Failed to connect to the bus\n"}, bg)
	require.NoError(t, err)
	require.Empty(t, res.Console, "the browser's own errors are not the page's")
	require.NoError(t, res.Err())

	res, err = open(map[string]string{"FAKE_PNG": blankPNG}, bg)
	require.NoError(t, err)
	require.ErrorContains(t, res.Err(), "is blank")

	_, err = open(map[string]string{}, bg)
	require.ErrorContains(t, err, "no screenshot")
	_, err = open(map[string]string{"FAKE_PNG": smallPNG}, bg)
	require.ErrorContains(t, err, "10 × 10 pixels, the window is 1280 × 2000")
	_, err = open(map[string]string{"FAKE_PNG": drawnPNG, "FAKE_EXIT": "3", "FAKE_LOG": "it broke"}, bg)
	require.ErrorContains(t, err, "exit status 3")
	require.ErrorContains(t, err, "it broke")
	ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
	defer cancel()
	// Killed, not waited for: a browser waited for would hold the test
	// ten minutes, past go test's -timeout.
	_, err = open(map[string]string{"FAKE_PNG": drawnPNG, "FAKE_SLEEP": "600"}, ctx)
	require.ErrorContains(t, err, "did not finish loading")

	_, err = Open(bg, fake, filepath.Join(dir, "missing.html"), t.TempDir())
	require.ErrorContains(t, err, "missing.html")
}

// TestConsoleErrorFailsInChromium loads two pages in the real browser: one
// whose script writes console.error("boom") fails Err, naming it; a clean
// one passes Load, which keeps its screenshot.
func TestConsoleErrorFailsInChromium(t *testing.T) {
	chromium := Chromium(t)
	dir := t.TempDir()
	bad := writeFile(t, dir, "bad.html", `<!DOCTYPE html><html><head><meta charset="utf-8"/><title>bad</title></head>`+
		`<body><h1>A page with a script</h1><script>console.error("boom")</script></body></html>`, 0o644)
	res, err := Open(context.Background(), chromium, bad, t.TempDir())
	require.NoError(t, err)
	require.ErrorContains(t, res.Err(), "boom")

	clean := writeFile(t, dir, "clean.html", `<!DOCTYPE html><html><head><meta charset="utf-8"/><title>clean</title></head>`+
		`<body><h1>A clean page</h1><div style="width:300px;height:200px;background:#3b6ec4"></div></body></html>`, 0o644)
	shot := Load(t, clean)
	require.FileExists(t, shot)
}

// outcome is a testing.TB that records whether Chromium skipped or failed.
type outcome struct {
	testing.TB
	skipped, failed string
}

func (o *outcome) Helper() {}
func (o *outcome) Skipf(format string, args ...any) {
	o.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (o *outcome) Fatalf(format string, args ...any) {
	o.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestChromiumSkipsOrFails: with no browser, Chromium skips the test, or
// fails it when VMARENA_REQUIRE_CHROMIUM=1.
func TestChromiumSkipsOrFails(t *testing.T) {
	t.Setenv(ChromiumEnv, "")
	t.Setenv("PATH", t.TempDir())
	call := func() *outcome {
		o := &outcome{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			Chromium(o)
		}()
		<-done
		return o
	}
	t.Setenv(RequireEnv, "")
	o := call()
	require.Contains(t, o.skipped, "no Chromium")
	require.Empty(t, o.failed)
	t.Setenv(RequireEnv, "1")
	o = call()
	require.Contains(t, o.failed, "VMARENA_REQUIRE_CHROMIUM=1 requires one")
	require.Empty(t, o.skipped)
}
