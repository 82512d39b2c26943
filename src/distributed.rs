//! Running a [`PrivateSession`](crate::PrivateSession)'s queries on an Apache DataFusion Ballista
//! cluster (cargo feature `distributed`; README, "Beyond one machine").
//!
//! What runs where:
//! - **Client** (the process that holds the `PrivateSession`): parsing, named arguments, planning,
//!   the guard, admission and the durable ledger, exactly as without a cluster. Only a plan that
//!   the guard checked and the accountant charged (and fsynced) is submitted.
//! - **Scheduler**: decodes the submitted logical plan (it resolves the dpfusion functions by
//!   name, so they are registered in its session), plans the distributed stages.
//! - **Executors**: scan files, run the partial aggregates (exact, un-noised, mergeable state),
//!   shuffle, and run the final aggregation, where `evaluate` draws the noise: once per release,
//!   never per partition or per executor.
//!
//! Only a [`CheckedPlan`] is submitted, as it was checked: [`admissible`] runs before admission
//! and refuses (nothing charged) a plan with a piece Ballista's codec cannot carry: the guard's
//! total-evaluation wrappers (`dp_total`, a `ScalarUDF` that holds its expression and is not
//! registered by name anywhere, so no `LogicalExtensionCodec::try_decode_udf` on the scheduler
//! could rebuild it from a name) are such a piece. Removing them would run a different plan (a
//! failing row would fail the query instead of giving NULL), so such a query is refused on a
//! cluster, with the reason; it runs in a session without a cluster. So are the unit bounding's
//! functions (`__dpfusion_unit_group_key`, whose secret per-query key lives in the instance, and
//! the `__dpfusion_unit_sample` aggregate): a query on a table with a privacy unit whose bounding
//! uses them (a GROUP BY, or a call that reads rows such as `dp_count` or `dp_mean`) runs in a
//! session without a cluster; one whose bounding is plain `sum`s and projections (ungrouped
//! `dp_sum`, `dp_count_distinct`) crosses. The guard's table wrappers
//! are removed (they only carry the policy the client has already enforced): file tables travel
//! as DataFusion listing scans, read by the executors from the same path. A plan that reads no
//! such file table runs in the client: in-memory batches, `dp_ledger()`, results of `CREATE
//! TABLE AS` and no table at all, whose rows are the client's, and private CSV tables, which
//! the client reads itself, whole and record by record ([`TotalCsvTable`], round 47; register
//! the data as Parquet to scan it on the cluster). A plan that mixes both is refused, with what
//! each table is.
//!
//! The scheduler and executors are trusted like the client's own DataFusion: they read raw rows,
//! and partial states cross the shuffle un-noised. Only what the final aggregation releases is
//! private, as on one machine.
use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use ballista::prelude::{SessionConfigExt, SessionContextExt};
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::utils::default_session_builder;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::catalog::Session;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::listing::ListingTable;
use datafusion::datasource::{provider_as_source, source_as_provider};
use datafusion::execution::context::{QueryPlanner, SessionContext};
use datafusion::execution::{FunctionRegistry, SessionState, SessionStateBuilder};
use datafusion::logical_expr::{Expr, LogicalPlan, TableScan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use datafusion::prelude::SessionConfig;

use crate::error::refused;
use crate::guard::{CheckedPlan, GuardedTable};
use crate::owner::TotalCsvTable;
use crate::session::SessionOptions;

/// Which Ballista cluster a session submits its queries to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cluster {
    /// An in-process scheduler and executor on loopback (random ports), started when the session
    /// opens: for tests and trying things out.
    Standalone,
    /// A running scheduler, e.g. `df://localhost:50050` (its executors must read table files at
    /// the paths the client registered).
    Remote(String),
}

impl SessionOptions {
    /// Run queries on an in-process Ballista scheduler and executor (loopback, random ports).
    pub fn with_ballista_standalone(mut self) -> Self {
        self.cluster = Some(Cluster::Standalone);
        self
    }

    /// Run queries on the Ballista scheduler at `url` (`df://host:port`).
    pub fn with_ballista_remote(mut self, url: impl Into<String>) -> Self {
        self.cluster = Some(Cluster::Remote(url.into()));
        self
    }
}

fn ballista_error(e: impl std::error::Error + Send + Sync + 'static) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Registers every dpfusion function (aggregates and scalars) on a DataFusion state.
pub fn register_functions(state: &mut SessionState) -> Result<()> {
    for udf in dpfusion_udfs::scalars::all_scalar_udfs() {
        state.register_udf(Arc::new(udf))?;
    }
    for udaf in dpfusion_udfs::aggregates::all_udafs() {
        state.register_udaf(Arc::new(udaf))?;
    }
    Ok(())
}

/// Ballista's default session for `config`, with every dpfusion function registered: the session
/// of a scheduler (its session builder) and the function registry of an executor.
pub fn function_state(config: SessionConfig) -> Result<SessionState> {
    let mut state = default_session_builder(config.upgrade_for_ballista())?;
    register_functions(&mut state)?;
    Ok(state)
}

/// The client context of a session on `cluster` (called by `PrivateSession::open`).
pub(crate) async fn connect(cluster: &Cluster, config: SessionConfig) -> Result<SessionContext> {
    let state = function_state(config)?;
    // The scheduler and executor of a standalone cluster get `state`, functions included.
    let ctx = match cluster {
        Cluster::Standalone => SessionContext::standalone_with_state(state).await?,
        Cluster::Remote(url) => SessionContext::remote_with_state(url, state).await?,
    };
    // Ballista's `upgrade_for_ballista` replaced the client's function lists with DataFusion's
    // defaults: register ours again. And wrap its query planner (see `DpQueryPlanner`).
    let client = ctx.state();
    let session_id = client.session_id().to_string();
    let planner = Arc::new(DpQueryPlanner {
        ballista: client.query_planner().clone(),
        local: DefaultPhysicalPlanner::default(),
    });
    let mut client = SessionStateBuilder::new_from_existing(client)
        .with_session_id(session_id)
        .with_query_planner(planner)
        .build();
    register_functions(&mut client)?;
    Ok(SessionContext::new_with_state(client))
}

/// Where a checked plan runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// On the cluster: every table it reads is a file table the cluster scans.
    Cluster,
    /// In the client: it reads no file table the cluster scans.
    Client,
}

/// The physical planner of a session on a cluster: submits plans over file tables to Ballista
/// (with the guard's wrappers removed), plans the others locally.
struct DpQueryPlanner {
    ballista: Arc<dyn QueryPlanner + Send + Sync>,
    local: DefaultPhysicalPlanner,
}

impl std::fmt::Debug for DpQueryPlanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DpQueryPlanner")
            .field("ballista", &self.ballista)
            .finish_non_exhaustive()
    }
}

type Provider = Arc<dyn datafusion::catalog::TableProvider>;

/// The provider under the guard's wrapper, and the wrapper (if any).
fn unwrap_scan(scan: &TableScan) -> Result<(Provider, Option<Provider>)> {
    let provider = source_as_provider(&scan.source)?;
    match provider.downcast_ref::<GuardedTable>() {
        Some(g) => Ok((g.inner().clone(), Some(provider.clone()))),
        None => Ok((provider, None)),
    }
}

/// Where a plan runs, by the tables it reads: file tables (DataFusion listing scans) on the
/// cluster; private CSV tables ([`TotalCsvTable`]: read in this client, whole and record by
/// record, round 47) and in-memory or system tables in the client; a plan that reads both is
/// refused, with what each table is.
fn placement(plan: &LogicalPlan) -> Result<Placement> {
    let mut files = Vec::new();
    let mut private_csv = Vec::new();
    let mut other = Vec::new();
    plan.apply_with_subqueries(|node| {
        if let LogicalPlan::TableScan(scan) = node {
            let (inner, _) = unwrap_scan(scan)?;
            let name = scan.table_name.to_string();
            if inner.downcast_ref::<ListingTable>().is_some() {
                files.push(name);
            } else if inner.downcast_ref::<TotalCsvTable>().is_some() {
                private_csv.push(name);
            } else {
                other.push(name);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if files.is_empty() {
        return Ok(Placement::Client);
    }
    let mut here = Vec::new();
    let mut advice = Vec::new();
    if !private_csv.is_empty() {
        here.push(format!(
            "private CSV tables ({}), which this client reads itself (a private CSV file is read \
             whole and record by record, so that a malformed record or a value that does not \
             convert reads as NULL; the cluster's readers do not)",
            private_csv.join(", ")
        ));
        advice.push("register the private CSV data as Parquet to scan it on the cluster");
    }
    if !other.is_empty() {
        here.push(format!(
            "in-memory or system tables ({}), which live in this client",
            other.join(", ")
        ));
        advice.push("register the in-memory data as a file");
    }
    if here.is_empty() {
        return Ok(Placement::Cluster);
    }
    refused!(
        "dpfusion on Ballista: this query reads file tables ({}), which the cluster scans, and \
         {}; one query cannot read both. To run it, {}, or query them separately.",
        files.join(", "),
        here.join(", and "),
        advice.join(", or ")
    )
}

/// Can `checked` run where it would run (the cluster or this client) exactly as it was checked?
/// Called before admission: a refusal charges nothing.
pub(crate) fn admissible(checked: &CheckedPlan) -> Result<()> {
    if placement(checked.plan())? == Placement::Cluster {
        crosses(checked.plan())?;
    }
    Ok(())
}

/// Refuses a plan with a piece Ballista's codec cannot carry as it is: the guard's
/// total-evaluation wrappers and the unit bounding's functions (see the module documentation).
fn crosses(plan: &LogicalPlan) -> Result<()> {
    let mut wrapped = None;
    let mut bounding = false;
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|x| {
                match x {
                    Expr::ScalarFunction(f) if f.func.name() == crate::guard::total::TOTAL => {
                        wrapped = Some(crate::guard::total::unwrap(x.clone())?.to_string());
                        return Ok(TreeNodeRecursion::Stop);
                    }
                    Expr::ScalarFunction(f)
                        if crate::guard::units::is_bounding_fn(f.func.name()) =>
                    {
                        bounding = true;
                        return Ok(TreeNodeRecursion::Stop);
                    }
                    Expr::AggregateFunction(f)
                        if crate::guard::units::is_bounding_fn(f.func.name()) =>
                    {
                        bounding = true;
                        return Ok(TreeNodeRecursion::Stop);
                    }
                    _ => {}
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    if bounding {
        return refused!(
            "dpfusion refused the query on the Ballista cluster: it reads a table with a privacy \
             unit, whose contribution bounding (a keyed per-query choice of each unit's groups and \
             a sample of its rows) runs in functions that cannot cross Ballista's codec; running \
             the plan without them would release more than one unit's bounded share. Run the \
             query in a session without a cluster. Nothing was charged."
        );
    }
    match wrapped {
        None => Ok(()),
        Some(e) => refused!(
            "dpfusion refused the query on the Ballista cluster: the expression {e} over private \
             rows could fail on a row, so the guard made it total (NULL where it fails), and that \
             wrapper cannot cross Ballista's codec; running it unwrapped would run another plan \
             than the one checked. Write row expressions that cannot fail (columns, literals, \
             CAST of numbers to DOUBLE), or run the query in a session without a cluster. \
             Nothing was charged."
        ),
    }
}

/// The plan as the cluster receives it: each guarded table scan reads the provider it wraps
/// (everything else as checked; [`crosses`] refused what the codec cannot carry).
fn unwrap_guarded(plan: &LogicalPlan) -> Result<LogicalPlan> {
    crosses(plan)?;
    plan.clone()
        .transform_up_with_subqueries(|node| {
            let LogicalPlan::TableScan(scan) = &node else {
                return Ok(Transformed::yes(node));
            };
            let (inner, wrapper) = unwrap_scan(scan)?;
            let Some(wrapper) = wrapper else {
                return Ok(Transformed::no(node));
            };
            if let Some(g) = wrapper.downcast_ref::<GuardedTable>() {
                g.record_remote_scan();
            }
            let mut scan = scan.clone();
            scan.source = provider_as_source(inner);
            Ok(Transformed::yes(LogicalPlan::TableScan(scan)))
        })
        .map(|t| t.data)
}

#[async_trait]
impl QueryPlanner for DpQueryPlanner {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match placement(logical_plan)? {
            Placement::Client => self.local.create_physical_plan(logical_plan, session).await,
            Placement::Cluster => {
                let plan = unwrap_guarded(logical_plan)?;
                self.ballista.create_physical_plan(&plan, session).await
            }
        }
    }
}

/// A scheduler and executors running inside this process on loopback (random ports).
#[derive(Debug, Clone)]
pub struct LocalCluster {
    /// The scheduler's address.
    pub scheduler: SocketAddr,
    /// How many executors were started.
    pub executors: usize,
}

impl LocalCluster {
    /// The URL a client connects to (`df://localhost:PORT`).
    pub fn url(&self) -> String {
        format!("df://localhost:{}", self.scheduler.port())
    }
}

/// Starts a scheduler and `executors` executors (each running `vcores` tasks at a time) inside
/// this process, on loopback with random ports, all with the dpfusion functions registered.
/// They run until the process exits.
pub async fn start_local_cluster(executors: usize, vcores: usize) -> Result<LocalCluster> {
    let state = function_state(SessionConfig::new_with_ballista())?;
    let scheduler = ballista_scheduler::standalone::new_standalone_scheduler_from_state(&state)
        .await
        .map_err(ballista_error)?;
    let url = format!("http://localhost:{}", scheduler.port());
    let mut tries = 0;
    let client = loop {
        match SchedulerGrpcClient::connect(url.clone()).await {
            Ok(c) => break c,
            Err(e) if tries >= 100 => {
                return Err(DataFusionError::Execution(format!(
                    "could not reach the in-process scheduler at {url}: {e}"
                )));
            }
            Err(_) => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };
    for _ in 0..executors {
        ballista_executor::new_standalone_executor_from_state(
            client.clone(),
            vcores.max(1),
            &state,
        )
        .await
        .map_err(ballista_error)?;
    }
    Ok(LocalCluster {
        scheduler,
        executors,
    })
}

/// Runs a Ballista scheduler that knows the dpfusion functions, bound to `bind`, until the
/// process is stopped. Clients connect to `df://HOST:PORT`; executors register with it.
pub async fn run_scheduler(bind: SocketAddr) -> Result<()> {
    let builder: ballista_scheduler::SessionBuilder = Arc::new(function_state);
    let config = SchedulerConfig {
        bind_host: bind.ip().to_string(),
        bind_port: bind.port(),
        ..Default::default()
    }
    .with_override_session_builder(builder);
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(ballista_error)?;
    start_server(cluster, bind, Arc::new(config))
        .await
        .map_err(ballista_error)
}

/// Where an executor listens and which scheduler it serves.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler's host and port.
    pub scheduler_host: String,
    pub scheduler_port: u16,
    /// The address the executor binds (Arrow Flight on `port`, gRPC on `grpc_port`).
    pub bind_host: String,
    /// The host name other executors and the client use to reach this one (default: bind_host).
    pub external_host: Option<String>,
    pub port: u16,
    pub grpc_port: u16,
    /// Tasks run at a time (0: the number of cores).
    pub vcores: usize,
}

impl Default for ExecutorOptions {
    fn default() -> Self {
        Self {
            scheduler_host: "localhost".into(),
            scheduler_port: 50050,
            bind_host: "127.0.0.1".into(),
            external_host: None,
            port: 50051,
            grpc_port: 50052,
            vcores: 0,
        }
    }
}

/// Runs a Ballista executor that knows the dpfusion functions until it receives Ctrl-C.
pub async fn run_executor(options: ExecutorOptions) -> Result<()> {
    let state = function_state(SessionConfig::new_with_ballista())?;
    let config = ExecutorProcessConfig {
        scheduler_host: options.scheduler_host,
        scheduler_port: options.scheduler_port,
        bind_host: options.bind_host,
        external_host: options.external_host,
        port: options.port,
        grpc_port: options.grpc_port,
        vcores: options.vcores,
        override_function_registry: Some(Arc::new(BallistaFunctionRegistry::from(&state))),
        ..Default::default()
    };
    start_executor_process(Arc::new(config))
        .await
        .map_err(ballista_error)
}
