package main
import ("testing";"distflash/model")
func TestDbgPlan(t *testing.T){
 h:=model.Heads{N:32,KV:32,Dim:128}
 for _,name:=range []string{"distflash","ring","zigzag","burst","ulysses","attn2d"}{
 for _,T:=range []int{32,64,128,256}{
  f,b,ft,bt,err:=runScheduleOnce(name,h,16,T)
  if err!=nil{t.Log(err);continue}
  Nd:=float64(T*32*128*4)
  t.Logf("%s T=%d fwd=%g bwd=%g tot/Nd fwd=%.3f bwd=%.3f", name,T,f,b,ft/Nd,bt/Nd)
 }}
}
