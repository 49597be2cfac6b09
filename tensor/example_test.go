package tensor_test

import (
	"fmt"

	"github.com/vmarena/vmarena/arena"
	"github.com/vmarena/vmarena/driver/host"
	"github.com/vmarena/vmarena/physical"
	"github.com/vmarena/vmarena/tensor"
	"github.com/vmarena/vmarena/vaspace"
)

// A tensor on an arena, a transposed view of it, a strided reshape refused
// and a contiguous copy reshaped instead.
func Example() {
	drv, err := host.New(host.Options{Capacity: 8 << 20})
	if err != nil {
		panic(err)
	}
	defer drv.Close()
	a, _ := arena.New(vaspace.New(drv), physical.New(drv), arena.Options{Max: 1 << 30})
	defer a.Close()

	x, _ := tensor.OnArena(a, tensor.Float32, 2, 3)
	defer x.Release()
	d, _ := tensor.Data[float32](x)
	copy(d, []float32{1, 2, 3, 4, 5, 6})

	xt, _ := x.Transpose(0, 1) // [3 2], a view: no copy
	v, _ := xt.At(2, 1)
	fmt.Println(xt.Shape(), xt.Strides(), v)

	_, err = xt.Reshape(6)
	fmt.Println(err != nil)

	y, _ := tensor.OnArena(a, tensor.Float32, 6)
	defer y.Release()
	c, _ := tensor.Data[float32](y)
	flat, _ := xt.Reshape(3, 2)
	_ = tensor.Copy(must(y.Reshape(3, 2)), flat)
	fmt.Println(c)
	// Output:
	// [3 2] [1 3] 6
	// true
	// [1 4 2 5 3 6]
}

func must(x *tensor.Tensor, err error) *tensor.Tensor {
	if err != nil {
		panic(err)
	}
	return x
}

// A growable tensor: rows appended one call at a time land after each
// other at a base that never moves, and earlier tensors stay valid.
func ExampleGrowable() {
	drv, err := host.New(host.Options{Capacity: 8 << 20})
	if err != nil {
		panic(err)
	}
	defer drv.Close()
	a, _ := arena.New(vaspace.New(drv), physical.New(drv), arena.Options{Max: 1 << 30})
	defer a.Close()

	g, _ := tensor.NewGrowable(a, tensor.Int32, 4) // rows of 4 int32
	defer g.Release()
	first, _ := g.AppendRows(1)
	_ = first.Set(7, 0, 3)
	for range 1000 {
		_, _ = g.AppendRows(2)
	}
	all, _ := g.Tensor()
	v, _ := first.At(0, 3)
	fmt.Println(all.Shape(), all.Addr() == a.Base(), v, a.Len())
	// Output:
	// [2001 4] true 7 32016
}
