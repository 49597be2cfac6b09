package tensor_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/vmarena/vmarena/driver"
	"github.com/vmarena/vmarena/driver/drivertest"
	"github.com/vmarena/vmarena/tensor"
)

// TestGrowableRows appends 1000 rows of 256 float32 one at a time, writing
// each; the base never moves, every earlier row tensor and every earlier
// whole tensor keeps reading what was written, and the arena is exactly
// the rows long.
func TestGrowableRows(t *testing.T) {
	const rows, width = 1000, 256
	const rowBytes = width * 4
	a := newArena(t, rows*rowBytes)
	g, err := tensor.NewGrowable(a, tensor.Float32, width)
	require.NoError(t, err)
	base := g.Base()
	require.Equal(t, a.Base(), base)
	require.Equal(t, rowBytes, g.RowBytes())
	val := func(r, c int) float32 { return float32(r*width + c) }

	empty, err := g.Tensor()
	require.NoError(t, err)
	require.Equal(t, []int{0, width}, empty.Shape())
	require.Equal(t, base, empty.Addr())

	var got []*tensor.Tensor // the tensor of each row
	var wholes []*tensor.Tensor
	for r := range rows {
		x, err := g.AppendRows(1)
		require.NoError(t, err)
		require.Equal(t, []int{1, width}, x.Shape())
		require.Equal(t, base+driver.Addr(r*rowBytes), x.Addr())
		d, err := tensor.Data[float32](x)
		require.NoError(t, err)
		for c := range d {
			d[c] = val(r, c)
		}
		got = append(got, x)
		require.Equal(t, r+1, g.Rows())
		require.Equal(t, uint64((r+1)*rowBytes), a.Len())
		require.Equal(t, base, g.Base())
		if r%97 == 0 {
			w, err := g.Tensor()
			require.NoError(t, err)
			require.Equal(t, base, w.Addr())
			again, err := g.Tensor()
			require.NoError(t, err)
			require.Same(t, w, again, "no new view while the rows are the same")
			wholes = append(wholes, w)
			require.NoError(t, g.Check())
		}
	}
	require.Equal(t, uint64(rows*rowBytes), a.Len())
	require.Equal(t, base, a.Base())
	// Every row tensor still reads its values.
	for r, x := range got {
		d, err := tensor.Data[float32](x)
		require.NoError(t, err)
		require.Equal(t, val(r, 0), d[0])
		require.Equal(t, val(r, width-1), d[width-1])
	}
	// Every whole tensor reads its rows (and only those).
	for _, w := range wholes {
		n := w.Shape()[0]
		d, err := tensor.Data[float32](w)
		require.NoError(t, err)
		require.Len(t, d, n*width)
		for r := range n {
			require.Equal(t, val(r, 17), d[r*width+17])
		}
	}
	all, err := g.Tensor()
	require.NoError(t, err)
	require.Equal(t, []int{rows, width}, all.Shape())
	v, err := all.At(rows-1, width-1)
	require.NoError(t, err)
	require.Equal(t, float64(val(rows-1, width-1)), v)
	// Writes through the whole tensor show in the row tensors.
	require.NoError(t, all.Set(-5, 500, 3))
	v, err = got[500].At(0, 3)
	require.NoError(t, err)
	require.Equal(t, -5.0, v)
	require.NoError(t, g.Check())

	// Max was rounded up to the granularity: fill it with one append of
	// the rows left, then one more row is refused and nothing changes.
	left := int(a.Max()/rowBytes) - rows
	require.Equal(t, 24, left)
	rest, err := g.AppendRows(left)
	require.NoError(t, err)
	require.Equal(t, []int{left, width}, rest.Shape())
	stats := a.Stats()
	_, err = g.AppendRows(1)
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory, "tensor: append 1 rows of [256] to a growable float32 tensor of 1024 rows", "past the arena's maximum")
	require.Equal(t, rows+left, g.Rows())
	require.Equal(t, stats, a.Stats())
	require.NoError(t, g.Check())

	// Tensors and views refuse Release; the Growable releases them all.
	drivertest.RequireIs(t, got[3].Release(), driver.ErrInvalid, "belongs to a Growable")
	require.NoError(t, g.Release())
	require.Zero(t, a.Stats().Views)
	_, err = got[0].At(0, 0)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	_, err = tensor.Data[float32](all)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	_, err = g.AppendRows(1)
	drivertest.RequireIs(t, err, driver.ErrClosed, "the growable was released")
	_, err = g.Tensor()
	drivertest.RequireIs(t, err, driver.ErrClosed)
	drivertest.RequireIs(t, g.Release(), driver.ErrClosed)
	require.NoError(t, a.Shrink(a.Len()))
}

func TestGrowableShapes(t *testing.T) {
	a := newArena(t, 4*gran)
	g, err := tensor.NewGrowable(a, tensor.Int8, 2, 3)
	require.NoError(t, err)
	defer func() { require.NoError(t, g.Release()) }()
	require.Equal(t, []int{2, 3}, g.RowShape())
	require.Equal(t, tensor.Int8, g.DType())
	x, err := g.AppendRows(4)
	require.NoError(t, err)
	require.Equal(t, []int{4, 2, 3}, x.Shape())
	fill(t, x, func(k int) float64 { return float64(k) })
	y, err := g.AppendRows(2)
	require.NoError(t, err)
	require.Equal(t, []int{2, 2, 3}, y.Shape())
	require.Equal(t, g.Base()+24, y.Addr())
	fill(t, y, func(k int) float64 { return float64(-k) })
	w, err := g.Tensor()
	require.NoError(t, err)
	want := make([]float64, 0, 36)
	for k := range 24 {
		want = append(want, float64(k))
	}
	for k := range 12 {
		want = append(want, float64(-k))
	}
	require.Equal(t, want, values(t, w))
	// Views of a growable's tensor work as any other.
	col, err := w.Permute(2, 0, 1)
	require.NoError(t, err)
	v, err := col.At(2, 4, 1)
	require.NoError(t, err)
	require.Equal(t, -5.0, v)

	// A scalar row.
	b := newArena(t, gran)
	s, err := tensor.NewGrowable(b, tensor.Int64)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Release()) }()
	r, err := s.AppendRows(3)
	require.NoError(t, err)
	require.Equal(t, []int{3}, r.Shape())
	require.Equal(t, uint64(24), b.Len())
}

func TestGrowableRefuses(t *testing.T) {
	s := newStack(t)
	a := s.arena(t, gran)
	for _, c := range []struct {
		name  string
		dt    tensor.DType
		row   []int
		frags []string
	}{
		{"negative", tensor.Float32, []int{-1}, []string{"tensor: growable float32 tensor of rows [-1]", "below zero"}},
		{"zero", tensor.Float32, []int{4, 0}, []string{"a row has no elements"}},
		{"dtype", tensor.DType(10), []int{4}, []string{"not a defined dtype"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := tensor.NewGrowable(a, c.dt, c.row...)
			drivertest.RequireIs(t, err, driver.ErrInvalid, c.frags...)
			require.Nil(t, g)
		})
	}
	_, err := tensor.NewGrowable(nil, tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "the arena is nil")

	require.NoError(t, a.Grow(8))
	_, err = tensor.NewGrowable(a, tensor.Float32, 4)
	drivertest.RequireIs(t, err, driver.ErrInvalid, "the arena is 8 B long, not empty")
	require.NoError(t, a.Shrink(8))

	g, err := tensor.NewGrowable(a, tensor.Float32, 4)
	require.NoError(t, err)
	defer func() { require.NoError(t, g.Release()) }()
	for _, n := range []int{0, -3} {
		_, err = g.AppendRows(n)
		drivertest.RequireIs(t, err, driver.ErrInvalid, "at least 1 must be appended")
	}
	_, err = g.AppendRows(int(gran)) // 16 bytes a row: past Max
	drivertest.RequireIs(t, err, driver.ErrOutOfMemory)
	require.Zero(t, g.Rows())
	require.Zero(t, a.Len())
	require.NoError(t, g.Check())
	// Someone else growing the arena (against NewGrowable's rule) gets no
	// byte of the rows: AppendRows refuses (ErrBusy) and nothing changes.
	require.NoError(t, a.Grow(4))
	require.NoError(t, g.Check())
	_, err = g.AppendRows(1)
	drivertest.RequireIs(t, err, driver.ErrBusy, "someone else resized it")
	require.Zero(t, g.Rows())
	require.Equal(t, uint64(4), a.Len())
	require.NoError(t, a.Shrink(4))
	require.NoError(t, g.Check())
}

// TestGrowableConcurrent appends, reads and takes whole tensors from
// several goroutines at once (run with -race).
func TestGrowableConcurrent(t *testing.T) {
	const workers, appends, width = 4, 50, 16
	a := newArena(t, workers*appends*2*width*8)
	g, err := tensor.NewGrowable(a, tensor.Int64, width)
	require.NoError(t, err)
	defer func() { require.NoError(t, g.Release()) }()
	type rows struct {
		x   *tensor.Tensor
		tag int64
	}
	results := make([][]rows, workers)
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := range appends {
				x, err := g.AppendRows(1 + i%2)
				if err != nil {
					errs <- err
					return
				}
				tag := int64(w*1000 + i)
				d, err := tensor.Data[int64](x)
				if err != nil {
					errs <- err
					return
				}
				for k := range d {
					d[k] = tag
				}
				results[w] = append(results[w], rows{x, tag})
				if _, err := g.Tensor(); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		require.NoError(t, <-errs)
	}
	require.Equal(t, workers*appends*3/2, g.Rows())
	require.Equal(t, uint64(g.Rows()*width*8), a.Len())
	require.NoError(t, g.Check())
	all, err := g.Tensor()
	require.NoError(t, err)
	d, err := tensor.Data[int64](all)
	require.NoError(t, err)
	seen := map[int64]int{}
	for _, v := range d {
		seen[v]++
	}
	for w := range workers {
		for i, r := range results[w] {
			rd, err := tensor.Data[int64](r.x)
			require.NoError(t, err)
			require.Equal(t, r.tag, rd[0])
			require.Equal(t, (1+i%2)*width, seen[r.tag], "each append's rows are its own")
		}
	}
}

// TestGrowableReleaseDuringAccess: Release waits for an access in flight
// through one of the Growable's tensors, and that access may ask the
// Growable about itself (Rows, RowShape, Check, Tensor, AppendRows)
// meanwhile: Release does not hold the Growable's lock while it waits,
// so the access finishes (the calls that need a live Growable answer
// ErrClosed), and then Release does.
func TestGrowableReleaseDuringAccess(t *testing.T) {
	a := newArena(t, 64*gran)
	g, err := tensor.NewGrowable(a, tensor.Float32, 4)
	require.NoError(t, err)
	x, err := g.AppendRows(2)
	require.NoError(t, err)
	released := make(chan error, 1)
	var rows int
	var checkErr, tensorErr, appendErr error
	err = x.Access(false, func(b []byte) error {
		go func() { released <- g.Release() }()
		for !x.Released() { // Release has begun: it waits for this access
			runtime.Gosched()
		}
		rows = g.Rows()
		checkErr = g.Check()
		_, tensorErr = g.Tensor()
		_, appendErr = g.AppendRows(1)
		return nil
	})
	require.NoError(t, err)
	require.NoError(t, <-released)
	require.Equal(t, 2, rows)
	require.NoError(t, checkErr)
	drivertest.RequireIs(t, tensorErr, driver.ErrClosed, "the growable was released")
	drivertest.RequireIs(t, appendErr, driver.ErrClosed, "the growable was released")
	drivertest.RequireIs(t, g.Release(), driver.ErrClosed, "already released")
	_, err = x.At(0, 0)
	drivertest.RequireIs(t, err, driver.ErrClosed)
	require.NoError(t, g.Check())
	require.Equal(t, uint64(2*16), a.Len(), "the arena keeps its length")
}
