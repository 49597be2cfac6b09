// Package browsertest opens pages in a headless Chromium for tests, as a
// person would open them: it loads a file, fails the test on anything the
// page writes to its console, and keeps a screenshot, checked to be a
// PNG of the window's size with something drawn on it, in the test's
// temporary directory.
//
// The browser is $VMARENA_CHROMIUM, or the first of chromium,
// chromium-browser and google-chrome on the PATH. Where there is none the
// test is skipped, unless VMARENA_REQUIRE_CHROMIUM=1 (set by .ci/run once
// it has installed Debian's chromium), which makes it a failure.
//
// Chromium's log does not tell a console error from a console.log: it
// logs every message of the page as INFO:CONSOLE. The pages tested here
// carry no script, so anything on the console — an error, an uncaught
// exception, a log — fails the test.
//
// It starts a browser process per page (a second or two each): tests
// should load few pages.
package browsertest

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmarena/vmarena/internal/errors"
)

// The environment variables that choose the browser and whether one must
// be there.
const (
	ChromiumEnv = "VMARENA_CHROMIUM"
	RequireEnv  = "VMARENA_REQUIRE_CHROMIUM"
)

// browsers are the names looked up on the PATH, in order.
var browsers = []string{"chromium", "chromium-browser", "google-chrome"}

// The window a page is loaded in, and so the screenshot's size.
const (
	WindowWidth  = 1280
	WindowHeight = 2000
)

// Timeout bounds one page's load, from the browser's start to its exit.
const Timeout = 60 * time.Second

// find returns the browser to run, or why there is none.
func find() (string, error) {
	if p := os.Getenv(ChromiumEnv); p != "" {
		path, err := exec.LookPath(p)
		if err != nil {
			return "", errors.Wrapf(err, "%s=%s", ChromiumEnv, p)
		}
		return path, nil
	}
	for _, name := range browsers {
		if path, err := exec.LookPath(name); err == nil {
			return path, nil
		}
	}
	return "", errors.Newf("no Chromium: none of %s on the PATH, and %s is not set", strings.Join(browsers, ", "), ChromiumEnv)
}

// Chromium returns the browser to run. With none, it skips t, or fails it
// when VMARENA_REQUIRE_CHROMIUM=1.
func Chromium(t testing.TB) string {
	t.Helper()
	path, err := find()
	if err == nil {
		return path
	}
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%v (%s=1 requires one)", err, RequireEnv)
	}
	t.Skipf("%v: install chromium to run this test", err)
	return ""
}

// Result is what loading a page showed.
type Result struct {
	// Console is each message the page wrote to its console, as Chromium
	// logged it.
	Console []string
	// Screenshot is the PNG file of the window.
	Screenshot string
	// Log is all Chromium wrote on stderr.
	Log string
}

// consoleLine matches Chromium's log line for a console message:
// `[pid:tid:time:INFO:CONSOLE:12] "msg", source: file:///... (12)`, or
// the older `INFO:CONSOLE(12)] ...`.
var consoleLine = regexp.MustCompile(`:CONSOLE[:(][^\]]*\]\s*(.*)$`)

// Open loads the HTML file name in the headless browser chromium, in a
// window of WindowWidth × WindowHeight with a profile of its own in dir,
// and saves a screenshot of it in dir. It fails when the browser does (or
// runs past ctx or Timeout) or leaves no screenshot that decodes as a PNG
// of the window's size; what the page said is in the result, for Err to
// judge.
func Open(ctx context.Context, chromium, name, dir string) (Result, error) {
	abs, err := filepath.Abs(name)
	if err != nil {
		return Result{}, errors.Wrap(err, "browsertest")
	}
	if _, err := os.Stat(abs); err != nil {
		return Result{}, errors.Wrap(err, "browsertest")
	}
	res := Result{Screenshot: filepath.Join(dir, strings.TrimSuffix(filepath.Base(name), filepath.Ext(name))+".png")}
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium,
		"--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--user-data-dir="+filepath.Join(dir, "chromium-profile"),
		"--screenshot="+res.Screenshot,
		"--window-size="+strconv.Itoa(WindowWidth)+","+strconv.Itoa(WindowHeight),
		"--enable-logging=stderr", "--v=0",
		"file://"+abs)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	// The browser's children (renderer, GPU process) share its process
	// group: a timeout ends them all, and output they still hold open
	// stops being waited for after WaitDelay.
	group(cmd)
	cmd.WaitDelay = 10 * time.Second
	err = cmd.Run()
	res.Log = log.String()
	for _, l := range strings.Split(res.Log, "\n") {
		if m := consoleLine.FindStringSubmatch(l); m != nil {
			res.Console = append(res.Console, m[1])
		}
	}
	if ctx.Err() != nil {
		return res, errors.Wrapf(ctx.Err(), "browsertest: %s did not finish loading %s", filepath.Base(chromium), name)
	}
	if err != nil {
		return res, errors.Wrapf(err, "browsertest: %s on %s; its log:\n%s", filepath.Base(chromium), name, tail(res.Log))
	}
	if err := checkPNG(res.Screenshot); err != nil {
		return res, errors.Wrapf(err, "browsertest: the screenshot of %s; the browser's log:\n%s", name, tail(res.Log))
	}
	return res, nil
}

// Err says what is wrong with what the page showed: any message on its
// console, or a screenshot with nothing drawn on it.
func (r Result) Err() error {
	if len(r.Console) > 0 {
		return errors.Newf("browsertest: the page wrote %d message(s) to its console: %s", len(r.Console), strings.Join(r.Console, "; "))
	}
	return blank(r.Screenshot)
}

// Load opens the HTML file name in this machine's Chromium (skipping t
// where there is none, see Chromium) and fails t if it cannot be loaded,
// if the page writes anything to its console, or if its screenshot is
// missing, not a PNG of the window or blank. It returns the screenshot's
// path, in t's temporary directory.
func Load(t testing.TB, name string) string {
	t.Helper()
	chromium := Chromium(t)
	res, err := Open(context.Background(), chromium, name, t.TempDir())
	if err == nil {
		err = res.Err()
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: screenshot %s", name, res.Screenshot)
	return res.Screenshot
}

// checkPNG checks that name is a PNG of the window's size.
func checkPNG(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return errors.Wrap(err, "no screenshot")
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil {
		return errors.Wrap(err, "not a PNG")
	}
	if cfg.Width != WindowWidth || cfg.Height != WindowHeight {
		return errors.Newf("%d × %d pixels, the window is %d × %d", cfg.Width, cfg.Height, WindowWidth, WindowHeight)
	}
	return nil
}

// minDrawn is the share of a screenshot's pixels that must differ from
// its top-left pixel (the page's background) for it to count as showing
// something: a paragraph of text is more.
const minDrawn = 0.001

// blank says whether the PNG name shows next to nothing.
func blank(name string) error {
	data, err := os.ReadFile(name)
	if err != nil {
		return errors.Wrap(err, "browsertest: no screenshot")
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		return errors.Wrap(err, "browsertest: the screenshot is not a PNG")
	}
	if n, all := drawn(img); float64(n) < minDrawn*float64(all) {
		return errors.Newf("browsertest: the screenshot %s is blank: %d of %d pixels differ from the background", name, n, all)
	}
	return nil
}

// drawn counts the pixels of img that differ from its top-left one.
func drawn(img image.Image) (n, all int) {
	b := img.Bounds()
	r0, g0, b0, a0 := img.At(b.Min.X, b.Min.Y).RGBA()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, a := img.At(x, y).RGBA()
			if r != r0 || g != g0 || bl != b0 || a != a0 {
				n++
			}
		}
	}
	return n, b.Dx() * b.Dy()
}

// tail is the end of a log, enough to say why a browser failed.
func tail(log string) string {
	const most = 2000
	if len(log) <= most {
		return log
	}
	return "…" + log[len(log)-most:]
}
