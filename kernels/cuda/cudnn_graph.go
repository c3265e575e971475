//go:build cuda

package cuda

// A small builder of cuDNN operation graphs over the backend API: tensors, pointwise, matmul,
// reduction and reshape operations, each a backend descriptor with its attributes set one
// cudnnBackendSetAttribute at a time and finalised, as cudnn-frontend's nodes do
// (include/cudnn_frontend/node/{pointwise,matmul,reduction,reshape}.h); then the operation
// graph, the engine heuristics (mode A, then the fallback list) and the first engine
// configuration whose execution plan finalises. The builder keeps a Go record of every tensor
// and operation (Graph.Describe) for error messages and tests.

/*
#include "cudnn_abi.h"
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"
)

// DataType is a cuDNN data type (cudnnDataType_t).
type DataType int

// The data types the SDPA graphs use.
const (
	Float32  DataType = C.CUDNN_DATA_FLOAT
	Half     DataType = C.CUDNN_DATA_HALF
	Int32    DataType = C.CUDNN_DATA_INT32
	BFloat16 DataType = C.CUDNN_DATA_BFLOAT16
	Int64    DataType = C.CUDNN_DATA_INT64
	Boolean  DataType = C.CUDNN_DATA_BOOLEAN
)

// String names the type as cuDNN's documentation does, e.g. "bfloat16".
func (t DataType) String() string {
	switch t {
	case Float32:
		return "float"
	case Half:
		return "half"
	case Int32:
		return "int32"
	case BFloat16:
		return "bfloat16"
	case Int64:
		return "int64"
	case Boolean:
		return "bool"
	}
	return fmt.Sprintf("DataType(%d)", int(t))
}

// size is the bytes of one element.
func (t DataType) size() int64 {
	switch t {
	case Half, BFloat16:
		return 2
	case Int64:
		return 8
	case Boolean:
		return 1
	}
	return 4
}

// PointwiseMode is a cudnnPointwiseMode_t.
type PointwiseMode int

// The pointwise modes the SDPA graphs use.
const (
	PwAdd          PointwiseMode = C.CUDNN_POINTWISE_ADD
	PwMul          PointwiseMode = C.CUDNN_POINTWISE_MUL
	PwDiv          PointwiseMode = C.CUDNN_POINTWISE_DIV
	PwSub          PointwiseMode = C.CUDNN_POINTWISE_SUB
	PwExp          PointwiseMode = C.CUDNN_POINTWISE_EXP
	PwLog          PointwiseMode = C.CUDNN_POINTWISE_LOG
	PwIdentity     PointwiseMode = C.CUDNN_POINTWISE_IDENTITY
	PwCmpGT        PointwiseMode = C.CUDNN_POINTWISE_CMP_GT
	PwCmpGE        PointwiseMode = C.CUDNN_POINTWISE_CMP_GE
	PwCmpLT        PointwiseMode = C.CUDNN_POINTWISE_CMP_LT
	PwLogicalAnd   PointwiseMode = C.CUDNN_POINTWISE_LOGICAL_AND
	PwGenIndex     PointwiseMode = C.CUDNN_POINTWISE_GEN_INDEX
	PwBinarySelect PointwiseMode = C.CUDNN_POINTWISE_BINARY_SELECT
)

var pwNames = map[PointwiseMode]string{
	PwAdd: "ADD", PwMul: "MUL", PwDiv: "DIV", PwSub: "SUB", PwExp: "EXP", PwLog: "LOG", PwIdentity: "IDENTITY",
	PwCmpGT: "CMP_GT", PwCmpGE: "CMP_GE", PwCmpLT: "CMP_LT", PwLogicalAnd: "LOGICAL_AND", PwGenIndex: "GEN_INDEX",
	PwBinarySelect: "BINARY_SELECT",
}

// String is the mode's name without CUDNN_POINTWISE_, e.g. "GEN_INDEX".
func (m PointwiseMode) String() string {
	if s, ok := pwNames[m]; ok {
		return s
	}
	return fmt.Sprintf("PointwiseMode(%d)", int(m))
}

// ports is the number of tensors an operation of mode m has (inputs and output), as
// cudnn-frontend's get_pointwise_mode_port_count counts them.
func (m PointwiseMode) ports() int {
	switch m {
	case PwExp, PwLog, PwIdentity, PwGenIndex:
		return 2
	case PwBinarySelect:
		return 4
	}
	return 3
}

// ReduceMode is a cudnnReduceTensorOp_t.
type ReduceMode int

// The reductions the SDPA graphs use.
const (
	ReduceAdd ReduceMode = C.CUDNN_REDUCE_TENSOR_ADD
	ReduceMax ReduceMode = C.CUDNN_REDUCE_TENSOR_MAX
)

// String is the operator's name without CUDNN_REDUCE_TENSOR_: "ADD" or "MAX".
func (m ReduceMode) String() string {
	if m == ReduceMax {
		return "MAX"
	}
	return "ADD"
}

// Tensor is one tensor of a graph.
type Tensor struct {
	UID     int64
	Name    string
	Type    DataType
	Dims    []int64
	Strides []int64
	Virtual bool
	ByValue bool    // a scalar passed by value at execution (host memory)
	Value   any     // a by-value tensor's value: float32 or int32
	Ragged  *Tensor // the ragged-offset tensor, if any

	desc C.cudnnBackendDescriptor_t
}

// Op is one operation of a graph, for Describe.
type Op struct {
	Kind    string // "MATMUL", "POINTWISE", "REDUCTION", "RESHAPE"
	Name    string // cudnn-frontend's name of the operation
	Mode    string // the pointwise mode or reduction operator
	Compute DataType
	Axis    int64 // GEN_INDEX's axis (-1 for every other operation)
	In      []*Tensor
	Out     *Tensor
	// Overrides are the matmul's M, N, K override tensors (nil where none).
	Overrides [3]*Tensor

	desc C.cudnnBackendDescriptor_t
}

// Graph builds one operation graph. The first failure is kept in err and makes every later
// call a no-op, so a builder reads straight through and checks once.
type Graph struct {
	n        *DNN
	describe bool // records tensors and operations only: no descriptors (DescribeSDPA)
	err      error
	nextUID  int64
	Tensors  []*Tensor
	Ops      []*Op
	descs    []C.cudnnBackendDescriptor_t // every descriptor made, destroyed by free
}

// NewGraph starts a graph on n's handle. Virtual tensors get unique ids from 1000 up.
func (n *DNN) NewGraph() *Graph { return &Graph{n: n, nextUID: 1000} }

// Err is the first failure of the builder.
func (g *Graph) Err() error { return g.err }

func (g *Graph) fail(err error) {
	if g.err == nil {
		g.err = err
	}
}

// create makes a backend descriptor of type t.
func (g *Graph) create(t int, what string) C.cudnnBackendDescriptor_t {
	if g.err != nil || g.describe {
		return nil
	}
	var d C.cudnnBackendDescriptor_t
	if err := descNew(what, t, &d); err != nil {
		g.fail(err)
		return nil
	}
	g.descs = append(g.descs, d)
	return d
}

// set is one cudnnBackendSetAttribute of count elements at p (Go memory without Go pointers).
func (g *Graph) set(d C.cudnnBackendDescriptor_t, what string, attr, typ int, count int, p unsafe.Pointer) {
	if g.err != nil || g.describe {
		return
	}
	g.fail(descSet(what, d, attr, typ, count, p))
}

func (g *Graph) setInt64s(d C.cudnnBackendDescriptor_t, what string, attr int, v ...int64) {
	g.set(d, what, attr, C.CUDNN_TYPE_INT64, len(v), unsafe.Pointer(&v[0]))
	runtime.KeepAlive(v)
}

func (g *Graph) setInt(d C.cudnnBackendDescriptor_t, what string, attr, typ int, v int32) {
	x := C.int(v)
	g.set(d, what, attr, typ, 1, unsafe.Pointer(&x))
}

func (g *Graph) setBool(d C.cudnnBackendDescriptor_t, what string, attr int, v bool) {
	var x C.uchar // cuDNN's CUDNN_TYPE_BOOLEAN is a C++ bool: one byte
	if v {
		x = 1
	}
	g.set(d, what, attr, C.CUDNN_TYPE_BOOLEAN, 1, unsafe.Pointer(&x))
}

func (g *Graph) setFloat(d C.cudnnBackendDescriptor_t, what string, attr int, v float32) {
	x := C.float(v)
	g.set(d, what, attr, C.CUDNN_TYPE_FLOAT, 1, unsafe.Pointer(&x))
}

func (g *Graph) setDescs(d C.cudnnBackendDescriptor_t, what string, attr int, ds ...C.cudnnBackendDescriptor_t) {
	if g.err != nil || g.describe {
		return
	}
	v := make([]C.uint64_t, len(ds))
	for i, x := range ds {
		v[i] = C.uint64_t(uintptr(unsafe.Pointer(x)))
	}
	g.fail(descSetDescs(what, d, attr, v))
}

func (g *Graph) finalize(d C.cudnnBackendDescriptor_t, what string) {
	if g.err != nil || g.describe {
		return
	}
	g.fail(g.n.finalize(d, "cudnnBackendFinalize("+what+")"))
}

// TensorSpec describes a tensor to add: UID 0 gives a virtual tensor a fresh id.
type TensorSpec struct {
	UID     int64
	Name    string
	Type    DataType
	Dims    []int64
	Strides []int64
	Virtual bool
	Ragged  *Tensor
}

// Tensor adds a tensor (CUDNN_BACKEND_TENSOR_DESCRIPTOR: data type, dimensions, strides, unique
// id, 16-byte alignment, virtual, ragged offset) and finalises it.
func (g *Graph) Tensor(s TensorSpec) *Tensor {
	if s.UID == 0 {
		s.UID = g.nextUID
		g.nextUID++
	}
	t := &Tensor{UID: s.UID, Name: s.Name, Type: s.Type, Dims: s.Dims, Strides: s.Strides, Virtual: s.Virtual, Ragged: s.Ragged}
	g.addTensor(t)
	return t
}

// ScalarFloat adds a by-value float scalar ([1,1,1,1]), as cudnn-frontend's
// Tensor_attributes(float) expands it to the rank of the graph's tensors.
func (g *Graph) ScalarFloat(uid int64, name string, v float32) *Tensor {
	t := &Tensor{UID: uid, Name: name, Type: Float32, Dims: []int64{1, 1, 1, 1}, Strides: []int64{1, 1, 1, 1}, ByValue: true, Value: v}
	g.addTensor(t)
	return t
}

// ScalarInt adds a by-value int32 scalar ([1,1,1,1]).
func (g *Graph) ScalarInt(uid int64, name string, v int32) *Tensor {
	t := &Tensor{UID: uid, Name: name, Type: Int32, Dims: []int64{1, 1, 1, 1}, Strides: []int64{1, 1, 1, 1}, ByValue: true, Value: v}
	g.addTensor(t)
	return t
}

func (g *Graph) addTensor(t *Tensor) {
	for _, o := range g.Tensors {
		if o.UID == t.UID {
			g.fail(fmt.Errorf("cudnn graph: tensors %s and %s have the same unique id %d", o.Name, t.Name, t.UID))
			return
		}
	}
	g.Tensors = append(g.Tensors, t)
	what := "tensor " + t.Name
	d := g.create(C.CUDNN_BACKEND_TENSOR_DESCRIPTOR, what)
	t.desc = d
	g.setInt(d, what, C.CUDNN_ATTR_TENSOR_DATA_TYPE, C.CUDNN_TYPE_DATA_TYPE, int32(t.Type))
	g.setInt64s(d, what, C.CUDNN_ATTR_TENSOR_DIMENSIONS, t.Dims...)
	g.setInt64s(d, what, C.CUDNN_ATTR_TENSOR_STRIDES, t.Strides...)
	g.setInt64s(d, what, C.CUDNN_ATTR_TENSOR_UNIQUE_ID, t.UID)
	g.setInt64s(d, what, C.CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 16)
	if t.Virtual {
		g.setBool(d, what, C.CUDNN_ATTR_TENSOR_IS_VIRTUAL, true)
	}
	if t.ByValue {
		g.setBool(d, what, C.CUDNN_ATTR_TENSOR_IS_BY_VALUE, true)
	}
	if t.Ragged != nil {
		g.setDescs(d, what, C.CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, t.Ragged.desc)
	}
	g.finalize(d, what)
}

// Virtual adds a virtual tensor of the given type and shape (dense strides, last dimension
// fastest, unless strides are given).
func (g *Graph) Virtual(name string, t DataType, dims []int64, strides ...int64) *Tensor {
	if strides == nil {
		strides = denseStrides(dims)
	}
	return g.Tensor(TensorSpec{Name: name, Type: t, Dims: dims, Strides: strides, Virtual: true})
}

// denseStrides are the strides of a packed row-major tensor of dims.
func denseStrides(dims []int64) []int64 {
	s := make([]int64, len(dims))
	acc := int64(1)
	for i := len(dims) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= dims[i]
	}
	return s
}

// Pointwise adds a pointwise operation: y = mode(in...) computed in compute precision. axis is
// GEN_INDEX's CUDNN_ATTR_POINTWISE_AXIS (the dimension whose index it generates); every other
// mode takes -1. cudnn-frontend keeps an axis on the index arithmetic of its masks too, as
// metadata, but writes the backend attribute only for GEN_INDEX (node/pointwise.h), so that is
// the only graph cuDNN's SDPA pattern matcher is known to take.
func (g *Graph) Pointwise(name string, mode PointwiseMode, compute DataType, axis int64, y *Tensor, in ...*Tensor) *Op {
	op := &Op{Kind: "POINTWISE", Name: name, Mode: mode.String(), Compute: compute, Axis: axis, In: in, Out: y}
	if len(in)+1 != mode.ports() {
		g.fail(fmt.Errorf("cudnn graph: pointwise %s (%s) with %d inputs", name, mode, len(in)))
		return op
	}
	if (mode == PwGenIndex) != (axis >= 0) {
		g.fail(fmt.Errorf("cudnn graph: pointwise %s (%s) with axis %d: GEN_INDEX and only GEN_INDEX has an axis", name, mode, axis))
		return op
	}
	what := "pointwise " + name
	pw := g.create(C.CUDNN_BACKEND_POINTWISE_DESCRIPTOR, what)
	g.setInt(pw, what, C.CUDNN_ATTR_POINTWISE_MODE, C.CUDNN_TYPE_POINTWISE_MODE, int32(mode))
	g.setInt(pw, what, C.CUDNN_ATTR_POINTWISE_MATH_PREC, C.CUDNN_TYPE_DATA_TYPE, int32(compute))
	if axis >= 0 {
		g.setInt64s(pw, what, C.CUDNN_ATTR_POINTWISE_AXIS, axis)
	}
	g.finalize(pw, what)
	d := g.create(C.CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, what)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_POINTWISE_XDESC, in[0].desc)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y.desc)
	if len(in) > 1 {
		g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_POINTWISE_BDESC, in[1].desc)
	}
	if len(in) > 2 {
		g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_POINTWISE_TDESC, in[2].desc)
	}
	g.setFloat(d, what, C.CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, 1)
	g.setFloat(d, what, C.CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, 1)
	g.finalize(d, what)
	op.desc = d
	g.Ops = append(g.Ops, op)
	return op
}

// Matmul adds c = a·b (batched over the leading dimensions, float accumulation); m, n, k
// override the GEMM's sizes per batch when not nil (variable sequence lengths).
func (g *Graph) Matmul(name string, c, a, b, m, n, k *Tensor) *Op {
	op := &Op{Kind: "MATMUL", Name: name, Compute: Float32, Axis: -1, In: []*Tensor{a, b}, Out: c, Overrides: [3]*Tensor{m, n, k}}
	what := "matmul " + name
	mm := g.create(C.CUDNN_BACKEND_MATMUL_DESCRIPTOR, what)
	g.setInt(mm, what, C.CUDNN_ATTR_MATMUL_COMP_TYPE, C.CUDNN_TYPE_DATA_TYPE, int32(Float32))
	g.finalize(mm, what)
	d := g.create(C.CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, what)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_MATMUL_ADESC, a.desc)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_MATMUL_BDESC, b.desc)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_MATMUL_CDESC, c.desc)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_MATMUL_DESC, mm)
	for i, attr := range []int{C.CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, C.CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC,
		C.CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC} {
		if t := op.Overrides[i]; t != nil {
			g.setDescs(d, what, attr, t.desc)
		}
	}
	g.finalize(d, what)
	op.desc = d
	g.Ops = append(g.Ops, op)
	return op
}

// Reduction adds y = reduce(x) over the dimensions where y has extent 1 and x not.
func (g *Graph) Reduction(name string, mode ReduceMode, y, x *Tensor) *Op {
	op := &Op{Kind: "REDUCTION", Name: name, Mode: mode.String(), Compute: Float32, Axis: -1, In: []*Tensor{x}, Out: y}
	what := "reduction " + name
	r := g.create(C.CUDNN_BACKEND_REDUCTION_DESCRIPTOR, what)
	g.setInt(r, what, C.CUDNN_ATTR_REDUCTION_COMP_TYPE, C.CUDNN_TYPE_DATA_TYPE, int32(Float32))
	g.setInt(r, what, C.CUDNN_ATTR_REDUCTION_OPERATOR, C.CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, int32(mode))
	g.finalize(r, what)
	d := g.create(C.CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, what)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_REDUCTION_DESC, r)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.desc)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.desc)
	g.finalize(d, what)
	op.desc = d
	g.Ops = append(g.Ops, op)
	return op
}

// Reshape adds y = x seen with other dimensions and strides (a transpose, for the backward's
// Pᵀ, dSᵀ and K).
func (g *Graph) Reshape(name string, y, x *Tensor) *Op {
	op := &Op{Kind: "RESHAPE", Name: name, Axis: -1, In: []*Tensor{x}, Out: y}
	what := "reshape " + name
	d := g.create(C.CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, what)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.desc)
	g.setDescs(d, what, C.CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.desc)
	g.finalize(d, what)
	op.desc = d
	g.Ops = append(g.Ops, op)
	return op
}

// Describe writes the graph one line per tensor and operation, in the order they were made.
func (g *Graph) Describe() string {
	var b strings.Builder
	for _, t := range g.Tensors {
		kind := "tensor"
		switch {
		case t.Virtual:
			kind = "virtual"
		case t.ByValue:
			kind = fmt.Sprintf("scalar=%v", t.Value)
		}
		fmt.Fprintf(&b, "%d %s %s %s %v %v", t.UID, t.Name, kind, t.Type, t.Dims, t.Strides)
		if t.Ragged != nil {
			fmt.Fprintf(&b, " ragged=%d", t.Ragged.UID)
		}
		b.WriteByte('\n')
	}
	for _, op := range g.Ops {
		fmt.Fprintf(&b, "%s %s %s", op.Kind, op.Name, op.Mode)
		for _, t := range op.In {
			fmt.Fprintf(&b, " %d", t.UID)
		}
		fmt.Fprintf(&b, " -> %d\n", op.Out.UID)
	}
	return b.String()
}

// free destroys every descriptor the graph made.
func (g *Graph) free() {
	for _, d := range g.descs {
		descFree(d)
	}
	g.descs = nil
}

// Plan is a finalised execution plan of a graph, with the non-virtual tensors its variant pack
// needs. Its descriptors live until Close.
type Plan struct {
	n         *DNN
	g         *Graph
	plan      C.cudnnBackendDescriptor_t
	cfgs      []C.cudnnBackendDescriptor_t
	Workspace int64    // bytes of workspace cuDNN asks for
	Engine    int64    // the global index of the engine chosen (-1 if unknown)
	Heuristic string   // "A" or "fallback": the heuristics list the engine came from
	Tried     []string // the engine configurations that did not finalise, and why
	scalars   unsafe.Pointer
	scalarOff map[int64]uintptr
}

// Build finalises the graph's operations into an operation graph and an execution plan: the
// engine configurations of heuristics mode A are tried in order, then those of the fallback
// list; the first whose plan finalises is taken. A graph no engine supports gives an error
// whose NotSupported is true (errors.As a CUDNNError).
func (g *Graph) Build() (*Plan, error) {
	if g.describe {
		return nil, errors.New("cudnn: Build of a graph made by DescribeSDPA")
	}
	if g.err != nil {
		g.free()
		return nil, g.err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	opg := g.create(C.CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph")
	if g.err == nil {
		g.fail(descSetHandle("operation graph handle", opg, C.CUDNN_ATTR_OPERATIONGRAPH_HANDLE, g.n.h))
	}
	ops := make([]C.cudnnBackendDescriptor_t, len(g.Ops))
	for i, op := range g.Ops {
		ops[i] = op.desc
	}
	if len(ops) > 64 {
		g.fail(fmt.Errorf("cudnn graph: %d operations (at most 64)", len(ops)))
	}
	g.setDescs(opg, "operation graph", C.CUDNN_ATTR_OPERATIONGRAPH_OPS, ops...)
	g.finalize(opg, "operation graph")
	p := &Plan{n: g.n, g: g, Engine: -1}
	for _, mode := range []struct {
		m    int32
		name string
	}{{C.CUDNN_HEUR_MODE_A, "A"}, {C.CUDNN_HEUR_MODE_FALLBACK, "fallback"}} {
		if g.err != nil || p.plan != nil {
			break
		}
		what := "engine heuristics " + mode.name
		heur := g.create(C.CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, what)
		g.setDescs(heur, what, C.CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, opg)
		g.setInt(heur, what, C.CUDNN_ATTR_ENGINEHEUR_MODE, C.CUDNN_TYPE_HEUR_MODE, mode.m)
		g.finalize(heur, what)
		if g.err != nil {
			break
		}
		var cfgs [16]C.cudnnBackendDescriptor_t
		var count C.int64_t
		if err := heuristics(heur, cfgs[:], &count); err != nil {
			p.Tried = append(p.Tried, fmt.Sprintf("heuristics %s: %v", mode.name, err))
			continue
		}
		for i := 0; i < int(count); i++ {
			cfg := cfgs[i]
			g.descs = append(g.descs, cfg)
			if p.plan != nil {
				continue
			}
			plan := g.create(C.CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan")
			if g.err == nil {
				g.fail(descSetHandle("execution plan handle", plan, C.CUDNN_ATTR_EXECUTION_PLAN_HANDLE, g.n.h))
			}
			g.setDescs(plan, "execution plan", C.CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg)
			if g.err != nil {
				break
			}
			engine := engineIndex(cfg)
			if err := g.n.finalize(plan, "cudnnBackendFinalize(execution plan)"); err != nil {
				p.Tried = append(p.Tried, fmt.Sprintf("engine %d (heuristics %s): %v", engine, mode.name, err))
				continue
			}
			p.plan, p.Engine, p.Heuristic = plan, engine, mode.name
		}
	}
	if g.err != nil {
		g.free()
		return nil, g.err
	}
	if p.plan == nil {
		g.free()
		return nil, CUDNNError{Call: "no engine finalises the graph", Code: C.CUDNN_STATUS_NOT_SUPPORTED,
			Last: strings.Join(p.Tried, "; ")}
	}
	var ws C.int64_t
	var n C.int64_t
	if err := descGet("execution plan workspace size", p.plan, C.CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, C.CUDNN_TYPE_INT64, 1, &n, unsafe.Pointer(&ws)); err != nil {
		g.free()
		return nil, err
	}
	p.Workspace = int64(ws)
	p.storeScalars()
	return p, nil
}

// storeScalars copies the by-value tensors' values into C memory: the variant pack holds their
// host addresses.
func (p *Plan) storeScalars() {
	var scalars []*Tensor
	for _, t := range p.g.Tensors {
		if t.ByValue {
			scalars = append(scalars, t)
		}
	}
	p.scalars = C.calloc(C.size_t(max(len(scalars), 1)), 8)
	p.scalarOff = map[int64]uintptr{}
	for i, t := range scalars {
		at := unsafe.Add(p.scalars, 8*i)
		switch v := t.Value.(type) {
		case float32:
			*(*float32)(at) = v
		case int32:
			*(*int32)(at) = v
		}
		p.scalarOff[t.UID] = uintptr(8 * i)
	}
}

// Inputs lists the unique ids of the plan's non-virtual, not by-value tensors: those Execute
// needs an address for.
func (p *Plan) Inputs() []int64 {
	var ids []int64
	for _, t := range p.g.Tensors {
		if !t.Virtual && !t.ByValue {
			ids = append(ids, t.UID)
		}
	}
	return ids
}

// Graph is the graph the plan was built from.
func (p *Plan) Graph() *Graph { return p.g }

// Execute queues the plan on the handle's stream with the device address of every tensor of
// Inputs (ptrs, by unique id) and a workspace of at least Workspace bytes.
func (p *Plan) Execute(ptrs map[int64]Ptr, workspace Ptr) error {
	if p.plan == nil {
		return errors.New("cudnn: execute of a closed plan")
	}
	var uids []C.int64_t
	var addrs []C.uint64_t
	for _, t := range p.g.Tensors {
		switch {
		case t.Virtual:
		case t.ByValue:
			uids = append(uids, C.int64_t(t.UID))
			addrs = append(addrs, C.uint64_t(uintptr(p.scalars)+p.scalarOff[t.UID]))
		default:
			a, ok := ptrs[t.UID]
			if !ok {
				return fmt.Errorf("cudnn: execute without an address for tensor %d (%s)", t.UID, t.Name)
			}
			uids = append(uids, C.int64_t(t.UID))
			addrs = append(addrs, C.uint64_t(a))
		}
	}
	if len(uids) > 64 {
		return fmt.Errorf("cudnn: a variant pack of %d tensors (at most 64)", len(uids))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return p.n.execute(p.plan, uids, addrs, C.uint64_t(workspace))
}

// Close destroys the plan's descriptors.
func (p *Plan) Close() {
	if p.g != nil {
		p.g.free()
	}
	if p.scalars != nil {
		C.free(p.scalars)
		p.scalars = nil
	}
	p.plan = nil
}
