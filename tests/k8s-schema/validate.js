#!/usr/bin/env node
/* validate.js: offline schema validation of rendered Kubernetes manifests.
 *
 * Usage: node validate.js LABEL FILE.json [LABEL FILE.json ...]
 * Each FILE holds a JSON array of objects (one rendered overlay, converted
 * from `kubectl kustomize` YAML by tests/integration/k8s_manifests.sh).
 *
 * Every object is validated with kubernetes-models' validate(): the
 * OpenAPI schema of its apiVersion/kind (Kubernetes 1.32 in 4.5.1): types,
 * required fields, enums, formats such as quantities. Unknown fields are not
 * rejected by those schemas (the API server's strict field validation
 * is stricter).
 *
 * kubernetes-models has no JobSet (jobset.x-k8s.io). A JobSet's own fields
 * are checked structurally here against the v1alpha2 API (known fields and
 * their types, unknown fields rejected), and the Job template inside each
 * replicated job is validated against batch/v1 JobTemplateSpec's schema.
 * The output says so for each JobSet.
 *
 * Output: "OK|what", "FAIL|what|why" lines and "# notes"; exit 1 when any
 * object fails or has a kind nothing here can check. */
"use strict";
const fs = require("fs");
const path = require("path");

let failed = 0;
const out = (s) => process.stdout.write(s + "\n");
const ok = (what) => out(`OK|${what}`);
const fail = (what, why) => { failed++; out(`FAIL|${what}|${String(why).replace(/\n/g, " ")}`); };

/* The kubernetes-models class for apiVersion/kind, or null. */
function modelFor(apiVersion, kind) {
    if (typeof apiVersion !== "string" || typeof kind !== "string" || !/^[A-Za-z0-9]+$/.test(kind)) return null;
    if (!/^([a-z0-9.-]+\/)?v[0-9]+((alpha|beta)[0-9]+)?$/.test(apiVersion)) return null;
    try {
        return require(`kubernetes-models/${apiVersion}/${kind}`)[kind] || null;
    } catch (e) {
        return null;
    }
}

/* ---- JobSet (jobset.x-k8s.io/v1alpha2), structural ---- */

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

function typeErr(p, v, want) { return `${p} must be ${want} (got ${JSON.stringify(v)})`; }

/* Check obj against fields {name: check(value, path) -> [errors]}; unknown
 * fields are errors; required lists fields that must be present. */
function fields(obj, p, spec, required = []) {
    if (obj === null || typeof obj !== "object" || Array.isArray(obj)) return [typeErr(p, obj, "an object")];
    const errs = [];
    for (const r of required) if (!(r in obj)) errs.push(`${p}/${r} is required`);
    for (const [k, v] of Object.entries(obj)) {
        if (!(k in spec)) errs.push(`${p}/${k} is not a field of the JobSet API (v1alpha2)`);
        else errs.push(...spec[k](v, `${p}/${k}`));
    }
    return errs;
}
const isBool = (v, p) => (typeof v === "boolean" ? [] : [typeErr(p, v, "a boolean")]);
const isStr = (v, p) => (typeof v === "string" ? [] : [typeErr(p, v, "a string")]);
const isInt = (min) => (v, p) => (Number.isInteger(v) && v >= min ? [] : [typeErr(p, v, `an integer >= ${min}`)]);
const isEnum = (...vals) => (v, p) => (vals.includes(v) ? [] : [typeErr(p, v, `one of ${vals.join(", ")}`)]);
const arrayOf = (check) => (v, p) => (Array.isArray(v) ? v.flatMap((x, i) => check(x, `${p}/${i}`)) : [typeErr(p, v, "an array")]);
const anyObj = (v, p) => (v && typeof v === "object" && !Array.isArray(v) ? [] : [typeErr(p, v, "an object")]);

function jobTemplate(v, p) {
    const { JobTemplateSpec } = require("kubernetes-models/batch/v1/JobTemplateSpec");
    try {
        new JobTemplateSpec(v).validate();
        return [];
    } catch (e) {
        return [`${p} (batch/v1 JobTemplateSpec schema): ${e.message}`];
    }
}

function replicatedJob(v, p) {
    const errs = fields(v, p, {
        name: (x, q) => (typeof x === "string" && DNS_LABEL.test(x) && x.length <= 63 ? [] : [typeErr(q, x, "a DNS label")]),
        replicas: isInt(0),
        template: jobTemplate,
        dependsOn: arrayOf((d, q) => fields(d, q, { name: isStr, status: isEnum("Ready", "Complete") }, ["name", "status"])),
    }, ["name", "template"]);
    return errs;
}

function checkJobSet(o) {
    const errs = [];
    const { ObjectMeta } = require("@kubernetes-models/apimachinery/apis/meta/v1/ObjectMeta");
    try {
        new ObjectMeta(o.metadata || {}).validate();
    } catch (e) {
        errs.push(`/metadata (ObjectMeta schema): ${e.message}`);
    }
    if (!o.metadata || !o.metadata.name) errs.push("/metadata/name is required");
    errs.push(...fields(o, "", { apiVersion: isStr, kind: isStr, metadata: anyObj, spec: (s, p) => fields(s, p, {
        replicatedJobs: (v, q) => (Array.isArray(v) && v.length ? arrayOf(replicatedJob)(v, q) : [typeErr(q, v, "a non-empty array")]),
        network: (v, q) => fields(v, q, { enableDNSHostnames: isBool, subdomain: isStr, publishNotReadyAddresses: isBool }),
        successPolicy: (v, q) => fields(v, q, { operator: isEnum("All", "Any"), targetReplicatedJobs: arrayOf(isStr) }, ["operator"]),
        failurePolicy: (v, q) => fields(v, q, {
            maxRestarts: isInt(0),
            restartStrategy: isEnum("Recreate", "BlockingRecreate"),
            rules: arrayOf(anyObj),
        }),
        startupPolicy: (v, q) => fields(v, q, { startupPolicyOrder: isEnum("AnyOrder", "InOrder") }, ["startupPolicyOrder"]),
        suspend: isBool,
        coordinator: anyObj,
        managedBy: isStr,
        ttlSecondsAfterFinished: isInt(0),
    }, ["replicatedJobs"]), status: anyObj }, ["apiVersion", "kind", "spec"]));
    return errs;
}

const STRUCTURAL = { "jobset.x-k8s.io/v1alpha2/JobSet": checkJobSet };

function main(args) {
    if (args.length < 2 || args.length % 2) {
        process.stderr.write("usage: node validate.js LABEL FILE.json [LABEL FILE.json ...]\n");
        return 2;
    }
    const pkg = require("kubernetes-models/package.json");
    out(`# kubernetes-models ${pkg.version} (node ${process.version})`);
    for (let i = 0; i < args.length; i += 2) {
        const label = args[i];
        let objs;
        try {
            objs = JSON.parse(fs.readFileSync(args[i + 1], "utf8"));
        } catch (e) {
            fail(`${label}: read ${path.basename(args[i + 1])}`, e.message);
            continue;
        }
        if (!Array.isArray(objs)) { fail(`${label}: objects`, "expected a JSON array"); continue; }
        const structural = [];
        let n = 0;
        for (const o of objs) {
            if (!o || typeof o !== "object") { fail(`${label}: object`, `not an object: ${JSON.stringify(o)}`); continue; }
            const id = `${o.kind || "?"}/${(o.metadata && o.metadata.name) || "?"}`;
            const key = `${o.apiVersion}/${o.kind}`;
            const M = modelFor(o.apiVersion, o.kind);
            if (M) {
                try {
                    new M(o).validate();
                    n++;
                } catch (e) {
                    fail(`schema ${label}: ${o.apiVersion} ${id}`, e.message);
                }
            } else if (STRUCTURAL[key]) {
                const errs = STRUCTURAL[key](o);
                if (errs.length) fail(`schema ${label}: ${o.apiVersion} ${id} (structural)`, errs.join("; "));
                else structural.push(`${id} (${o.apiVersion})`);
            } else {
                fail(`schema ${label}: ${id}`, `no schema for apiVersion ${o.apiVersion} kind ${o.kind} (kubernetes-models ${pkg.version} has none, nor this script)`);
            }
        }
        ok(`schema ${label}: ${n} object(s) valid against the Kubernetes OpenAPI schemas`);
        for (const s of structural)
            ok(`schema ${label}: ${s} checked structurally only (kubernetes-models has no JobSet): its own fields by this script, its Job templates against batch/v1 JobTemplateSpec`);
    }
    return failed ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
