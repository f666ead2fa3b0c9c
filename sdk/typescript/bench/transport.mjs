// The consumer's transport alone: `fetch` against `node:http` with a kept-alive agent, on
// a local server answering each POST (a 100-receipt ack body) with a 100-delivery
// `:receive`-sized answer; 4 callers, 2,000 calls per pass, two passes each way. Prints
// wall and CPU (this process: client and server together) per call.
//
//   node bench/transport.mjs

import http from "node:http";
const ans = Buffer.from(JSON.stringify({deliveries: Array.from({length:100},(_,i)=>({id:"o"+i,payload:{n:i},priority:"normal",attempt:1,due_at_ms:1,dispatched_at_ms:2,receipt:"4.1764271234567-12.1764271299999.1.0123456789abcdef0123456789abcdef",lease_until_ms:3}))}));
const srv = http.createServer((req,res)=>{req.resume();req.on("end",()=>{res.writeHead(200,{"content-type":"application/json"}).end(ans);});});
srv.keepAliveTimeout=60000;
await new Promise(r=>srv.listen(0,"127.0.0.1",r));
const url=`http://127.0.0.1:${srv.address().port}/x`;
const body=JSON.stringify({receipts:Array.from({length:100},()=>"4.1764271234567-12.1764271299999.1.0123456789abcdef0123456789abcdef")});
const N=2000;
async function viaFetch(){ const r=await fetch(url,{method:"POST",headers:{"content-type":"application/json",authorization:"Bearer x"},body,signal:AbortSignal.timeout(30000)}); return r.text(); }
const agent=new http.Agent({keepAlive:true});
function viaHttp(){ return new Promise((resolve,reject)=>{ const req=http.request(url,{method:"POST",agent,headers:{"content-type":"application/json",authorization:"Bearer x","content-length":Buffer.byteLength(body)}},res=>{const chunks=[];res.on("data",c=>chunks.push(c));res.on("end",()=>resolve(Buffer.concat(chunks).toString("utf8")));}); req.on("error",reject); req.end(body);});}
for (const [name,f] of [["fetch",viaFetch],["http",viaHttp],["fetch",viaFetch],["http",viaHttp]]) {
  const c0=process.cpuUsage(); const t0=performance.now();
  await Promise.all(Array.from({length:4},async()=>{for(let i=0;i<N/4;i++) await f();}));
  const c=process.cpuUsage(c0); console.log(name, "wall ms/req", ((performance.now()-t0)/N).toFixed(3), "cpu us/req (incl server)", ((c.user+c.system)/N).toFixed(0));
}
srv.close(); agent.destroy();
